package configfile

import (
	"bytes"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadTakesRegularFilesUpToTheLimit(t *testing.T) {
	dir := t.TempDir()
	exact := filepath.Join(dir, "exact")
	want := bytes.Repeat([]byte("k"), MaxSize)
	if err := os.WriteFile(exact, want, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(exact, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{exact, link} {
		got, err := Read(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Read(%s) = %d bytes, %v; want the %d bytes written", p, len(got), err, len(want))
		}
		if err := Check(p); err != nil {
			t.Fatalf("Check(%s) = %v", p, err)
		}
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(empty); err != nil || len(got) != 0 {
		t.Fatalf("Read(empty) = %q, %v", got, err)
	}
}

// Each of these paths would hang a reader (a pipe with no writer, an
// endless device) or fill memory (a device, a huge file) if it were read
// as it is; every one is refused, and says what it is.
func TestReadRefusesWhatIsNotARegularFileOfBoundedSize(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("k"), MaxSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fifoLink := filepath.Join(dir, "pipe-link")
	if err := os.Symlink(fifo, fifoLink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want string
	}{
		{dir, "is a directory, not a regular file"},
		{"/dev/zero", "is a character device, not a regular file"},
		{fifo, "is a named pipe, not a regular file"},
		{fifoLink, "is a named pipe, not a regular file"},
		{sock, "is a socket, not a regular file"},
		{big, "more than 1 MiB"},
		{filepath.Join(dir, "missing"), "no such file"},
		{"", "no path given"},
	} {
		data, err := Read(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Read(%q) = %d bytes, %v; want an error saying %q", c.path, len(data), err, c.want)
		}
		if err := Check(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%q) = %v; want an error saying %q", c.path, err, c.want)
		}
	}
	if err := Check(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Check(missing) = %v; want it to wrap fs.ErrNotExist", err)
	}
}
