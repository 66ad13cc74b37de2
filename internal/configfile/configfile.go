// Package configfile reads the files a configuration names (a JWT public
// key, an OAuth client's private key, an ID token, an mcp.json) so that a
// wrong path cannot hang or exhaust the process: only a regular file is
// read, and no more than MaxSize bytes of it. A directory, a device such
// as /dev/zero, a named pipe or a socket is refused before anything is
// read, and opening a named pipe that nothing writes to does not block.
//
// It never parses what it reads: its callers say what the content must be.
package configfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// MaxSize is the most a file named in the config may hold: 1 MiB, far more
// than a key, an ID token or an mcp.json needs.
const MaxSize = 1 << 20

// maxSizeText is MaxSize as the errors give it.
const maxSizeText = "1 MiB"

// Read returns the content of the regular file at path. A symlink is
// followed; what it leads to must be a regular file of at most MaxSize
// bytes.
func Read(path string) ([]byte, error) {
	// What the path names is checked before it is opened (a socket does
	// not open, and a device may do something when it is), and again on
	// what was opened, in case it changed in between.
	if err := Check(path); err != nil {
		return nil, err
	}
	// O_NONBLOCK: a named pipe put there since opens at once instead of
	// waiting for a writer, and is then refused by its mode. It changes
	// nothing for a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := check(path, fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s holds more than %s, the most a file named in the config may hold", path, maxSizeText)
	}
	return data, nil
}

// Check reports, without reading it, whether Read would refuse the file at
// path for what it is: not a regular file, or too big. The error of a path
// where nothing is wraps fs.ErrNotExist, for a caller to whom a file that
// appears later is fine.
func Check(path string) error {
	if path == "" {
		return errors.New("no path given")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return check(path, fi)
}

func check(path string, fi fs.FileInfo) error {
	mode := fi.Mode()
	if !mode.IsRegular() {
		return fmt.Errorf("%s is %s, not a regular file", path, kind(mode))
	}
	if fi.Size() > MaxSize {
		return fmt.Errorf("%s holds %d bytes, more than %s, the most a file named in the config may hold", path, fi.Size(), maxSizeText)
	}
	return nil
}

// kind names what a file that is not a regular one is.
func kind(mode fs.FileMode) string {
	switch {
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeCharDevice != 0:
		return "a character device"
	case mode&fs.ModeDevice != 0:
		return "a block device"
	default:
		return "a special file"
	}
}
