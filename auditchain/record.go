// Package auditchain makes an append-only log tamper-evident: each record
// carries a sequence number and the SHA-256 of the record before it, and
// signed checkpoints (Ed25519) vouch for the chain up to them.
//
// A record is one line of JSON. The writer puts two fields first:
//
//	{"seq":12,"prev":"<hex SHA-256 of record 11's line>",…the entry's own fields…}
//
// The hash covers a record's exact bytes, without its newline. The chain
// runs across rotated files: the first record of a file chains from the last
// record of the file before it. The first record of a chain is a checkpoint
// with seq 1, a prev of 64 zeros and "genesis":true.
//
// A checkpoint is a record of its own in the chain:
//
//	{"seq":40,"prev":"…","checkpoint":{"ts":"…","reason":"interval","key_id":"…"},"sig":"<base64>"}
//
// Its signature covers the line without its sig field, and so, through prev,
// every record before it. Records after the last checkpoint are chained but
// not signed: anyone who can write the file can cut them off, or rewrite them
// and recompute their hashes, without Verify noticing. Records up to a
// checkpoint cannot be removed, reordered or changed without it noticing.
//
// Every checkpoint names its chain ("chain", 128 random bits in hex, chosen
// at genesis). A log cut right after a checkpoint (a stop checkpoint of an
// earlier run, say) still verifies on its own: what tells is the chain's
// latest checkpoint kept where the writer's files are not (an Anchor, kept
// by a Keeper), which Verify compares the log with. A writer that opens a
// file its kept checkpoint is missing from says so, signed, in its start
// checkpoint ("cut"), so that going on writing never hides the cut; one
// that finds no record of its log at all while a checkpoint of it is kept
// (every file removed) says so in the genesis checkpoint of the new chain
// it begins, naming the earlier chain.
package auditchain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// MaxLine is the longest record line Verify and the tail reader accept. The
// writer keeps its lines shorter: an entry over MaxEntry (or one that is not
// a JSON object, over MaxEntry/6, as escaping may grow it six-fold) is
// recorded by its length, hash and first HeadBytes.
const (
	MaxLine   = 4 << 20
	MaxEntry  = MaxLine - 1024
	HeadBytes = 64 << 10
)

// Hash is the SHA-256 of a record's line.
type Hash [sha256.Size]byte

// Genesis is the prev of a chain's first record.
var Genesis Hash

func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// HashLine hashes a record's line (without its newline).
func HashLine(line []byte) Hash { return sha256.Sum256(line) }

const (
	seqKey        = `{"seq":`
	prevKey       = `,"prev":"`
	checkpointKey = `"checkpoint":`
	sigKey        = `,"sig":"`
	// signContext is signed before a checkpoint's body, so that the
	// signature means nothing anywhere else.
	signContext = "zidane-audit-checkpoint-v1\n"
)

// parsed is a line read back.
type parsed struct {
	seq  uint64
	prev Hash
	cp   *checkpoint // nil for an entry
	body []byte      // a checkpoint's signed body
	sig  []byte
}

// checkpoint is what a checkpoint record says.
type checkpoint struct {
	TS      string   `json:"ts"`
	Reason  string   `json:"reason"`
	KeyID   string   `json:"key_id"`
	Chain   string   `json:"chain,omitempty"` // the chain id: random at genesis, the same in every checkpoint after
	Genesis bool     `json:"genesis,omitempty"`
	Partial *Partial `json:"partial,omitempty"`
	Cut     *Cut     `json:"cut,omitempty"`
}

// Cut is what a start checkpoint says when the file it goes on in was cut:
// the checkpoint kept outside the log (see Keeper) is seq Kept, and the
// file ended before it (or held another record there). Chain is set when
// the writer found no record of the log at all (its files were removed)
// and began a new chain: it is the chain whose checkpoint seq Kept is.
type Cut struct {
	Kept  uint64 `json:"kept"`
	Chain string `json:"chain,omitempty"`
}

// Partial describes the bytes of a record that a crash or a failed write cut
// short, which the next checkpoint acknowledges.
type Partial struct {
	Bytes  int    `json:"bytes"`
	SHA256 string `json:"sha256"`
}

func partialOf(b []byte) *Partial {
	h := sha256.Sum256(b)
	return &Partial{Bytes: len(b), SHA256: hex.EncodeToString(h[:])}
}

// parsePrefix reads the seq and prev that open every record, and returns
// the rest of the line after them.
func parsePrefix(line []byte) (seq uint64, prev Hash, rest []byte, err error) {
	if !bytes.HasPrefix(line, []byte(seqKey)) {
		return 0, prev, nil, errors.New(`it does not begin with the "seq" field`)
	}
	rest = line[len(seqKey):]
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' && i < 20 {
		i++
	}
	if i == 0 || (rest[0] == '0' && i > 1) {
		return 0, prev, nil, errors.New("its seq is not a number")
	}
	seq, perr := strconv.ParseUint(string(rest[:i]), 10, 64)
	if perr != nil || seq == 0 {
		return 0, prev, nil, errors.New("its seq is not a positive number")
	}
	rest = rest[i:]
	if !bytes.HasPrefix(rest, []byte(prevKey)) || len(rest) < len(prevKey)+2*len(prev)+1 {
		return 0, prev, nil, errors.New(`its seq is not followed by "prev"`)
	}
	rest = rest[len(prevKey):]
	if _, herr := hex.Decode(prev[:], rest[:2*len(prev)]); herr != nil || rest[2*len(prev)] != '"' || !isLowerHex(rest[:2*len(prev)]) {
		return 0, prev, nil, errors.New("its prev is not 64 lowercase hex digits")
	}
	return seq, prev, rest[2*len(prev)+1:], nil
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseLine reads one record line.
func parseLine(line []byte) (parsed, error) {
	seq, prev, rest, err := parsePrefix(line)
	if err != nil {
		return parsed{}, err
	}
	p := parsed{seq: seq, prev: prev}
	if bytes.Count(line, []byte(`"seq":`)) != 1 || bytes.Count(line, []byte(`"prev":`)) != 1 {
		return parsed{}, errors.New(`it holds "seq" or "prev" more than once`)
	}
	if bytes.HasPrefix(rest, []byte(","+checkpointKey)) {
		i := bytes.LastIndex(line, []byte(sigKey))
		if i < 0 || !bytes.HasSuffix(line, []byte(`"}`)) {
			return parsed{}, errors.New("it is a checkpoint without a signature")
		}
		sig, derr := base64Std.DecodeString(string(line[i+len(sigKey) : len(line)-2]))
		if derr != nil {
			return parsed{}, errors.New("its signature is not base64")
		}
		body := append(line[:i:i], '}')
		var cp struct {
			Checkpoint *checkpoint `json:"checkpoint"`
		}
		if err := json.Unmarshal(body, &cp); err != nil || cp.Checkpoint == nil {
			return parsed{}, fmt.Errorf("its checkpoint is not valid JSON")
		}
		p.cp, p.body, p.sig = cp.Checkpoint, body, sig
		return p, nil
	}
	if !json.Valid(line) {
		return parsed{}, errors.New("it is not valid JSON")
	}
	return p, nil
}

// appendRecord appends the record of entry (one JSON object, as a logger
// encodes it, with or without its newline) with seq and prev, and a newline.
func appendRecord(dst []byte, seq uint64, prev Hash, entry []byte) []byte {
	entry = bytes.TrimRight(entry, "\r\n")
	dst = appendPrefix(dst, seq, prev)
	plain := plainObject(entry)
	switch {
	// Escaped as a JSON string, an entry may grow six-fold: the line must
	// stay under MaxLine all the same.
	case len(entry) > MaxEntry || (!plain && len(entry) > MaxEntry/6):
		head := entry[:HeadBytes]
		h := sha256.Sum256(entry)
		dst = append(dst, `,"oversize":{"bytes":`...)
		dst = strconv.AppendInt(dst, int64(len(entry)), 10)
		dst = append(dst, `,"sha256":"`...)
		dst = hex.AppendEncode(dst, h[:])
		dst = append(dst, `","head":`...)
		dst = appendJSONString(dst, head)
		dst = append(dst, "}}"...)
	case plain:
		if len(bytes.TrimSpace(entry[1:len(entry)-1])) == 0 {
			dst = append(dst, '}')
		} else {
			dst = append(dst, ',')
			dst = append(dst, entry[1:]...)
		}
	default:
		dst = append(dst, `,"raw":`...)
		dst = appendJSONString(dst, entry)
		dst = append(dst, '}')
	}
	return append(dst, '\n')
}

// plainObject reports whether entry can take seq and prev as it is: a JSON
// object (as the logger's JSON encoder writes it) holding no key that a
// reader of the record would confuse with the chain's. Anything else is
// recorded as a string, under "raw".
func plainObject(entry []byte) bool {
	return len(entry) >= 2 && entry[0] == '{' && entry[len(entry)-1] == '}' &&
		!bytes.HasPrefix(entry[1:], []byte(checkpointKey)) && !hasChainKey(entry)
}

// hasChainKey reports whether entry holds `"seq":` or `"prev":` (a key, at
// any depth: inside a JSON string a quote is escaped), in one pass over its
// colons.
func hasChainKey(entry []byte) bool {
	for i := 0; ; {
		j := bytes.IndexByte(entry[i:], ':')
		if j < 0 {
			return false
		}
		i += j
		if bytes.HasSuffix(entry[:i], []byte(`"seq"`)) || bytes.HasSuffix(entry[:i], []byte(`"prev"`)) {
			return true
		}
		i++
	}
}

func appendPrefix(dst []byte, seq uint64, prev Hash) []byte {
	dst = append(dst, seqKey...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, prevKey...)
	dst = hex.AppendEncode(dst, prev[:])
	return append(dst, '"')
}

func appendJSONString(dst, s []byte) []byte {
	b, _ := json.Marshal(string(s)) // a string always marshals
	return append(dst, b...)
}
