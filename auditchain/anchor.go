package auditchain

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
)

// An Anchor is a chain's latest checkpoint kept where the log's writer's
// files are not (Caddy's storage, a copy on another volume). Records up to
// a checkpoint cannot be changed unnoticed, but the log can be cut right
// after any checkpoint, a stop checkpoint of an earlier run included, and
// it then verifies on its own. Compared with an anchor, a log that ends
// before the anchor's seq, or that holds another record there, fails.
//
// An anchor is the checkpoint's own line: its signature makes a forged one
// fail, so where it is kept needs to be out of the log writer's reach, not
// secret. A copy rolled back to an older checkpoint of the same chain goes
// unnoticed; keep it where rolling back needs more than the log's file.
type Anchor struct {
	Chain string // the chain id its checkpoint names
	Seq   uint64
	Hash  Hash   // of Line
	Line  []byte // the checkpoint record, without its newline
	// From says where it was kept, for messages (a storage key, a file).
	From string

	cp   *checkpoint
	body []byte
	sig  []byte
}

// ChainIDLen is the length of a chain id: 128 random bits in hex.
const ChainIDLen = 32

var chainIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ValidChainID reports whether id has the form of a chain id, so that it
// can name a key.
func ValidChainID(id string) bool { return chainIDPattern.MatchString(id) }

// newChainID makes the id of a new chain.
func newChainID() string {
	b := make([]byte, ChainIDLen/2)
	_, _ = rand.Read(b) // crypto/rand never fails
	return hex.EncodeToString(b)
}

// ParseAnchor reads a checkpoint line kept outside the log (trailing
// newlines and spaces are trimmed). It checks the form, not the signature:
// Verify checks that with the keys it is given.
func ParseAnchor(line []byte, from string) (*Anchor, error) {
	line = bytes.TrimRight(line, "\r\n\t ")
	if len(line) > MaxLine {
		return nil, fmt.Errorf("%s: a checkpoint kept outside the log is one line of under %d bytes; this is longer", from, MaxLine)
	}
	p, err := parseLine(line)
	if err != nil {
		return nil, fmt.Errorf("%s: not an audit checkpoint: %v", from, err)
	}
	if p.cp == nil {
		return nil, fmt.Errorf("%s: an audit record, but not a checkpoint", from)
	}
	if !ValidChainID(p.cp.Chain) {
		return nil, fmt.Errorf("%s: the checkpoint names no chain id", from)
	}
	return &Anchor{Chain: p.cp.Chain, Seq: p.seq, Hash: HashLine(line), Line: bytes.Clone(line), From: from, cp: p.cp, body: p.body, sig: p.sig}, nil
}

// verify checks the anchor's signature with keys (by key id).
func (a *Anchor) verify(keys map[string]ed25519.PublicKey) error {
	key, ok := keys[a.cp.KeyID]
	if !ok {
		return fmt.Errorf("the checkpoint kept in %s is signed by key %s, which no --public-key given is", a.From, a.cp.KeyID)
	}
	if !ed25519.Verify(key, append([]byte(signContext), a.body...), a.sig) {
		return fmt.Errorf("the checkpoint kept in %s does not verify with key %s: it was forged or changed", a.From, a.cp.KeyID)
	}
	return nil
}

// Keeper keeps a chain's latest checkpoint outside the log.
type Keeper interface {
	// Latest returns the latest checkpoint kept of chain, or nil when none
	// is. The chain asks once, when it opens a file that goes on with a
	// chain, so that a log cut while no process wrote it is told apart
	// from one that goes on. It is called under the chain's lock, and
	// should answer promptly.
	Latest(chain string) (*Anchor, error)
	// Last returns the latest checkpoint kept of the log this keeper
	// serves, of whatever chain, or nil when none is. The chain asks when
	// it finds no record of its log (no file, or none that holds one), so
	// that a log whose files were all removed while no process wrote it
	// is told apart from a first start: it begins a new chain, which
	// would otherwise verify on its own. Called under the chain's lock.
	Last() (*Anchor, error)
	// Keep takes the checkpoint just written and synced. It is called
	// under the chain's lock, so it must not block: keep the latest,
	// write it elsewhere.
	Keep(Anchor)
}
