package message

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON-level rules: RFC 8259's grammar exactly, plus the refusals that
// keep every reader on one reading of a value (see the package doc). They
// hold for every value anywhere in a body, read or not.

// maxDepth is how deep objects and arrays may nest. JSON.parse, go-sdk
// (1000) and encoding/json (10000) each have their own limit; 128 is far
// under all of them and far over any MCP message.
const maxDepth = 128

// smallObject is how many keys an object holds before its duplicate check
// moves from a linear scan over the keys to a map.
const smallObject = 16

// reader reads one body, on one goroutine.
type reader struct {
	b []byte
	i int

	// keys holds the keys of the objects being read, innermost last, for
	// the duplicate check; canon holds the folded spelling of those that
	// are not plain ASCII. An object truncates both back when it closes.
	keys  []keyRef
	canon []byte

	amb  *Error // first ambiguity; reading goes on, to report syntax first
	bad  *Error // first malformation; likewise
	elem int    // batch element being read, or -1

	answers bool // reading a server's messages (ReadAnswer)
}

// keyRef is one key of an object being read: its content in b, and for a
// key with escapes or non-ASCII bytes, its folded form in canon.
type keyRef struct {
	start, end int // content, between the quotes
	cs, ce     int // folded form in canon; cs < 0 for a plain ASCII key
}

func (k keyRef) plain() bool { return k.cs < 0 }

func (r *reader) init(b []byte, keys []keyRef, canon []byte) {
	*r = reader{b: b, keys: keys, canon: canon, elem: -1}
}

// readers keeps readers' scratch (the key stack and folded keys) from one
// body to the next. A reader is used by one goroutine at a time.
var readers = sync.Pool{New: func() any {
	return &reader{keys: make([]keyRef, 0, 32), canon: make([]byte, 0, 256)}
}}

func getReader(b []byte) *reader {
	r := readers.Get().(*reader)
	r.init(b, r.keys[:0], r.canon[:0])
	return r
}

// putReader returns r to the pool, unless one body grew its scratch large.
func putReader(r *reader) {
	if cap(r.keys) > 1024 || cap(r.canon) > 16<<10 {
		return
	}
	r.b, r.amb, r.bad = nil, nil, nil
	readers.Put(r)
}

func (r *reader) syntax(at int, msg string) error {
	return &Error{Kind: ErrSyntax, Offset: at, Msg: msg}
}

func (r *reader) eof() error {
	return r.syntax(len(r.b), "the body ends in the middle of a JSON value; send the whole message")
}

// ambiguous records the first ambiguity. Reading goes on: a body that is
// also not JSON is reported as a syntax error.
func (r *reader) ambiguous(at int, msg string) {
	if r.amb == nil {
		r.amb = &Error{Kind: ErrAmbiguous, Offset: at, Msg: r.inElem(msg)}
	}
}

// malformed records the first malformation. Reading goes on, to report
// syntax errors and ambiguities first.
func (r *reader) malformed(at int, msg string) {
	if r.bad == nil {
		r.bad = &Error{Kind: ErrMalformed, Offset: at, Msg: r.inElem(msg)}
	}
}

func (r *reader) inElem(msg string) string {
	if r.elem < 0 {
		return msg
	}
	return fmt.Sprintf("batch element %d: %s", r.elem, msg)
}

func (r *reader) tooDeep() error {
	return &Error{Kind: ErrAmbiguous, Offset: r.i, Msg: r.inElem(fmt.Sprintf(
		"objects and arrays nested deeper than %d levels; readers differ on how deep they go, send a flatter message", maxDepth))}
}

// result is the error to return once reading is over: a syntax error
// first, then an ambiguity, then a malformation.
func (r *reader) result(err error) error {
	switch {
	case err != nil:
		return err
	case r.amb != nil:
		return r.amb
	case r.bad != nil:
		return r.bad
	}
	return nil
}

// ws skips JSON whitespace: space, tab, line feed, carriage return.
func (r *reader) ws() {
	i, b := r.i, r.b
	for i < len(b) && space[b[i]] {
		i++
	}
	r.i = i
}

var space = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

func (r *reader) peek() byte {
	if r.i < len(r.b) {
		return r.b[r.i]
	}
	return 0
}

// bom reports a UTF-8 byte-order mark at the start of the body. JSON.parse
// and encoding/json refuse it, but some stacks (TextDecoder, body parsers)
// strip it first: a reading that depends on who strips.
func (r *reader) bom() {
	if bytes.HasPrefix(r.b, []byte("\xef\xbb\xbf")) {
		r.ambiguous(0, "the body starts with a byte-order mark, which some readers strip and others refuse; send JSON without one")
		r.i = 3
	}
}

// trailing refuses anything after the top-level value: stream decoders
// (go-sdk's among them) read the first value and ignore the rest, where a
// strict reader refuses the body.
func (r *reader) trailing() {
	r.ws()
	if r.i < len(r.b) {
		r.ambiguous(r.i, "bytes after the JSON value; stream readers stop at the first value and others refuse, send exactly one JSON value")
	}
}

// value validates and skips any JSON value at r.i, inside containers
// nested depth deep.
func (r *reader) value(depth int) error {
	if r.i >= len(r.b) {
		return r.eof()
	}
	switch c := r.b[r.i]; c {
	case '"':
		_, _, _, err := r.str()
		return err
	case '{':
		return r.object(depth + 1)
	case '[':
		return r.array(depth + 1)
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			_, _, err := r.number()
			return err
		}
	}
	return r.syntax(r.i, "expected a JSON value (object, array, string, number, true, false or null)")
}

func (r *reader) literal(lit string) error {
	if len(r.b)-r.i >= len(lit) && string(r.b[r.i:r.i+len(lit)]) == lit {
		r.i += len(lit)
		return nil
	}
	return r.syntax(r.i, "expected a JSON value (object, array, string, number, true, false or null)")
}

// number validates and skips a number, RFC 8259 grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (r *reader) number() (start, end int, err error) {
	b, j := r.b, r.i
	start = j
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		j = digits(b, j+1)
	default:
		return 0, 0, r.syntax(j, "a number needs a digit here")
	}
	if j < len(b) && b[j] == '.' {
		k := digits(b, j+1)
		if k == j+1 {
			return 0, 0, r.syntax(k, "a number needs a digit after its decimal point")
		}
		j = k
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := digits(b, j)
		if k == j {
			return 0, 0, r.syntax(k, "a number needs a digit in its exponent")
		}
		j = k
	}
	r.i = j
	return start, j, nil
}

func digits(b []byte, j int) int {
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	return j
}

func (r *reader) array(depth int) error {
	if depth > maxDepth {
		return r.tooDeep()
	}
	r.i++ // '['
	r.ws()
	if r.peek() == ']' {
		r.i++
		return nil
	}
	for {
		r.ws()
		if err := r.value(depth); err != nil {
			return err
		}
		r.ws()
		if r.i >= len(r.b) {
			return r.eof()
		}
		switch r.b[r.i] {
		case ',':
			r.i++
		case ']':
			r.i++
			return nil
		default:
			return r.syntax(r.i, "expected ',' or ']' after an array element")
		}
	}
}

// object validates and skips an object whose fields nobody reads; its keys
// still pass the duplicate check.
func (r *reader) object(depth int) error {
	it, err := r.openObject(depth)
	if err != nil {
		return err
	}
	for {
		_, more, err := r.nextKey(&it)
		if err != nil || !more {
			return err
		}
		if err := r.value(depth); err != nil {
			return err
		}
	}
}

// objIter walks the members of one object: nextKey returns each key with
// r.i on its value, which the caller then reads.
type objIter struct {
	depth     int
	keyBase   int
	canonBase int
	n         int
	set       map[string]struct{} // folded keys, once the object is large
}

func (r *reader) openObject(depth int) (objIter, error) {
	if depth > maxDepth {
		return objIter{}, r.tooDeep()
	}
	r.i++ // '{'
	return objIter{depth: depth, keyBase: len(r.keys), canonBase: len(r.canon)}, nil
}

// nextKey reads the separator and the next key with its ':'. It returns
// false at the end of the object.
func (r *reader) nextKey(it *objIter) (keyRef, bool, error) {
	r.ws()
	if r.i >= len(r.b) {
		return keyRef{}, false, r.eof()
	}
	switch c := r.b[r.i]; {
	case c == '}' && it.n == 0:
		r.i++
		r.closeObject(it)
		return keyRef{}, false, nil
	case it.n == 0:
	case c == ',':
		r.i++
		r.ws()
	case c == '}':
		r.i++
		r.closeObject(it)
		return keyRef{}, false, nil
	default:
		return keyRef{}, false, r.syntax(r.i, "expected ',' or '}' after an object member")
	}
	it.n++
	if r.peek() != '"' {
		if r.i >= len(r.b) {
			return keyRef{}, false, r.eof()
		}
		return keyRef{}, false, r.syntax(r.i, "expected a string key")
	}
	s, e, fl, err := r.str()
	if err != nil {
		return keyRef{}, false, err
	}
	k := keyRef{start: s, end: e, cs: -1}
	if fl != 0 {
		k.cs = len(r.canon)
		r.canon = appendFolded(r.canon, r.b[s:e])
		k.ce = len(r.canon)
	}
	r.remember(it, k)
	r.ws()
	if r.i >= len(r.b) {
		return keyRef{}, false, r.eof()
	}
	if r.b[r.i] != ':' {
		return keyRef{}, false, r.syntax(r.i, "expected ':' after an object key")
	}
	r.i++
	r.ws()
	return k, true, nil
}

func (r *reader) closeObject(it *objIter) {
	r.keys = r.keys[:it.keyBase]
	r.canon = r.canon[:it.canonBase]
}

// remember adds k to its object's keys and refuses it when the object
// already has it: encoding/json and JSON.parse keep the last of two equal
// keys, other readers the first or both. Keys are equal when they are the
// same once escapes are decoded and case is folded, because encoding/json
// matches struct fields that way. It also refuses "__proto__" (see
// protoKey).
func (r *reader) remember(it *objIter, k keyRef) {
	r.protoKey(k)
	if it.set != nil {
		s := r.folded(k)
		if _, dup := it.set[s]; dup {
			r.ambiguous(k.start-1, "an object has the same key twice (once case is folded and escapes are decoded); readers differ on which one counts, send each key once")
			return
		}
		it.set[s] = struct{}{}
		return
	}
	keys := r.keys[it.keyBase:]
	for _, o := range keys {
		if r.sameKey(o, k) {
			r.dupKey(o, k)
			break
		}
	}
	if len(keys) < smallObject {
		r.keys = append(r.keys, k)
		return
	}
	it.set = make(map[string]struct{}, 4*smallObject)
	for _, o := range keys {
		it.set[r.folded(o)] = struct{}{}
	}
	it.set[r.folded(k)] = struct{}{}
	r.keys = r.keys[:it.keyBase]
}

func (r *reader) dupKey(a, b keyRef) {
	var why string
	switch {
	case a.plain() && b.plain() && bytes.Equal(r.b[a.start:a.end], r.b[b.start:b.end]):
		why = "an object has the same key twice"
	case !bytes.Contains(r.b[a.start:a.end], []byte{'\\'}) && !bytes.Contains(r.b[b.start:b.end], []byte{'\\'}):
		why = "two keys of one object are the same key once case is folded (encoding/json matches fields case-insensitively)"
	default:
		why = "two keys of one object are the same key once their escapes are decoded and case is folded"
	}
	r.ambiguous(b.start-1, why+"; readers differ on which one counts, send each key once, spelled exactly")
}

// protoKey refuses the key "__proto__": JSON.parse makes it an own
// property, but JavaScript code that copies an object by assignment
// (Object.assign, many merges) makes its value the copy's prototype, whose
// fields then read as the object's own.
func (r *reader) protoKey(k keyRef) {
	const proto = "__proto__"
	if k.plain() {
		if string(r.b[k.start:k.end]) != proto {
			return
		}
	} else if !canonIs(r.canon[k.cs:k.ce], proto) {
		return
	}
	r.ambiguous(k.start-1, `a key "__proto__": JavaScript code that copies the object reads it as the prototype; rename it`)
}

// sameKey reports whether a and b are the same key once escapes are
// decoded and case folded.
func (r *reader) sameKey(a, b keyRef) bool {
	switch {
	case a.plain() && b.plain():
		return a.end-a.start == b.end-b.start && asciiFoldEqual(r.b[a.start:a.end], r.b[b.start:b.end])
	case a.plain():
		return canonEqualPlain(r.canon[b.cs:b.ce], r.b[a.start:a.end])
	case b.plain():
		return canonEqualPlain(r.canon[a.cs:a.ce], r.b[b.start:b.end])
	}
	return bytes.Equal(r.canon[a.cs:a.ce], r.canon[b.cs:b.ce])
}

// folded returns k's folded form as a map key.
func (r *reader) folded(k keyRef) string {
	if !k.plain() {
		return string(r.canon[k.cs:k.ce])
	}
	s := r.b[k.start:k.end]
	out := make([]byte, len(s))
	for i, c := range s {
		out[i] = upper(c)
	}
	return string(out)
}

// Folding. A key folds rune by rune to the least rune of its
// unicode.SimpleFold orbit, as encoding/json's foldName does, so two keys
// fold equal exactly when strings.EqualFold says they are equal: "name",
// "NAME" and "nAmE" are one key, and so are "s" and "ſ" (U+017F), "k" and
// "K" (U+212A). For ASCII that least rune is the upper case letter.

func upper(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

func asciiFoldEqual(a, b []byte) bool {
	for i := range a {
		if x, y := a[i], b[i]; x != y && upper(x) != upper(y) {
			return false
		}
	}
	return true
}

// canonEqualPlain reports whether the folded form canon equals the plain
// ASCII key p once folded.
func canonEqualPlain(canon, p []byte) bool {
	if len(canon) != len(p) {
		return false
	}
	for i, c := range p {
		if canon[i] != upper(c) {
			return false
		}
	}
	return true
}

// canonIs reports whether the folded form canon is the ASCII name folded.
func canonIs(canon []byte, name string) bool {
	if len(canon) != len(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if canon[i] != upper(name[i]) {
			return false
		}
	}
	return true
}

func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// appendFolded appends the folded form of a validated string's content.
func appendFolded(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		var c rune
		switch b := s[i]; {
		case b == '\\':
			c, i = unescape(s, i)
		case b < utf8.RuneSelf:
			dst = append(dst, upper(b))
			i++
			continue
		default:
			var n int
			c, n = utf8.DecodeRune(s[i:])
			i += n
		}
		if c < utf8.RuneSelf {
			dst = append(dst, upper(byte(c)))
		} else {
			dst = utf8.AppendRune(dst, foldRune(c))
		}
	}
	return dst
}

// appendUnescaped appends a validated string's content with its escapes
// decoded.
func appendUnescaped(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		j := bytes.IndexByte(s[i:], '\\')
		if j < 0 {
			return append(dst, s[i:]...)
		}
		dst = append(dst, s[i:i+j]...)
		var c rune
		c, i = unescape(s, i+j)
		dst = utf8.AppendRune(dst, c)
	}
	return dst
}

// unescape decodes the validated escape at s[i] and returns the rune and
// the index after it. A lone surrogate, already refused, decodes to U+FFFD.
func unescape(s []byte, i int) (rune, int) {
	switch s[i+1] {
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	case 'u':
		c := rune(hex4(s[i+2:]))
		if utf16.IsSurrogate(c) {
			if i+12 <= len(s) && s[i+6] == '\\' && s[i+7] == 'u' {
				if d := rune(hex4(s[i+8:])); d >= 0 {
					if p := utf16.DecodeRune(c, d); p != utf8.RuneError {
						return p, i + 12
					}
				}
			}
			return utf8.RuneError, i + 6
		}
		return c, i + 6
	}
	return rune(s[i+1]), i + 2 // '"', '\\', '/'
}

// hex4 decodes four hex digits, or returns -1.
func hex4(s []byte) int {
	if len(s) < 4 {
		return -1
	}
	v := 0
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		v = v<<4 | int(c)
	}
	return v
}

// Strings.

const (
	hasEscape   = 1 << iota // the string has a backslash escape
	hasNonASCII             // the string has bytes >= 0x80
)

// plainByte marks the bytes a string's content may hold that need no
// further look: not '"', not '\\', not a control character, ASCII.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special returns a mask with the high bit set in the lowest byte of w
// that is '"', '\\', < 0x20 or >= 0x80 (bytes above it may be flagged
// falsely, by a borrow; the lowest flagged byte never is).
//
// x-0x01.. sets a byte's high bit when the byte is zero (it borrows) or
// >= 0x81. Xored with '"' or '\\', a byte is zero when it is that
// character, and >= 0x80 only when it was >= 0x80, which |w flags anyway;
// w-0x20.. sets the high bit of a byte < 0x20. A borrow only leaves a byte
// that is itself flagged, so it can only flag bytes above.
func special(w uint64) uint64 {
	q := w ^ (lsb * '"')
	s := w ^ (lsb * '\\')
	return ((q - lsb) | (s - lsb) | (w - lsb*0x20) | w) & msb
}

// str reads the string at r.i and returns its content's span and what it
// holds. It refuses what JSON does not allow (control characters, escapes
// outside the set, a missing quote) as syntax, and what readers decode
// differently as ambiguous: invalid UTF-8 (Go readers replace it with
// U+FFFD, a fatal TextDecoder refuses it) and lone or misordered
// surrogate escapes (Go readers decode U+FFFD, JavaScript keeps the
// surrogate).
func (r *reader) str() (start, end int, flags uint8, err error) {
	b := r.b
	j := r.i + 1
	start = j
	for {
		// Sixteen bytes at a time to the next byte that needs a look.
		for ; j+16 <= len(b); j += 16 {
			m1 := special(binary.LittleEndian.Uint64(b[j:]))
			m2 := special(binary.LittleEndian.Uint64(b[j+8:]))
			if m1|m2 != 0 {
				if m1 != 0 {
					j += bits.TrailingZeros64(m1) >> 3
				} else {
					j += 8 + bits.TrailingZeros64(m2)>>3
				}
				break
			}
		}
		for j < len(b) && plainByte[b[j]] {
			j++
		}
		if j >= len(b) {
			return 0, 0, 0, r.syntax(r.i, "a string has no closing quote")
		}
		switch c := b[j]; {
		case c == '"':
			r.i = j + 1
			return start, j, flags, nil
		case c == '\\':
			flags |= hasEscape
			if j, err = r.escape(j); err != nil {
				return 0, 0, 0, err
			}
		case c < 0x20:
			return 0, 0, 0, r.syntax(j, "a control character in a string; escape it (\\n, \\t, \\u0000)")
		default:
			flags |= hasNonASCII
			for j < len(b) && b[j] >= utf8.RuneSelf {
				c, n := utf8.DecodeRune(b[j:])
				if c == utf8.RuneError && n == 1 {
					r.ambiguous(j, "invalid UTF-8 in a string (some readers replace it with U+FFFD, others refuse it); send valid UTF-8")
				}
				j += n
			}
		}
	}
}

// escape validates the escape at b[j] and returns the index after it.
func (r *reader) escape(j int) (int, error) {
	b := r.b
	if j+1 >= len(b) {
		return 0, r.syntax(r.i, "a string has no closing quote")
	}
	switch b[j+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return j + 2, nil
	case 'u':
	default:
		return 0, r.syntax(j, `an escape JSON does not have; use \" \\ \/ \b \f \n \r \t or \uXXXX`)
	}
	c := hex4(b[j+2:])
	if c < 0 {
		return 0, r.syntax(j, `\u needs four hex digits`)
	}
	switch {
	case c >= 0xdc00 && c <= 0xdfff:
		r.ambiguous(j, `a \u escape of a lone low surrogate (Go readers decode U+FFFD, JavaScript keeps it); send the character itself or a surrogate pair`)
	case c >= 0xd800 && c <= 0xdbff:
		if len(b) >= j+12 && b[j+6] == '\\' && b[j+7] == 'u' {
			if d := hex4(b[j+8:]); d >= 0xdc00 && d <= 0xdfff {
				return j + 12, nil
			}
		}
		r.ambiguous(j, `a \u escape of a lone high surrogate (Go readers decode U+FFFD, JavaScript keeps it); send the character itself or a surrogate pair`)
	}
	return j + 6, nil
}
