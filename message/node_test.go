package message

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// nodeReader reads each body as the TypeScript SDK's stack does: a fatal
// UTF-8 TextDecoder, JSON.parse, then case-sensitive access to own
// properties. It prints one JSON line per body.
const nodeReader = `
const readline = require('node:readline');
const dec = new TextDecoder('utf-8', { fatal: true });
const own = (o, k) => o !== null && typeof o === 'object' && !Array.isArray(o) && Object.prototype.hasOwnProperty.call(o, k);
const get = (o, k) => own(o, k) ? o[k] : undefined;
const kind = (v) => v === undefined ? 'undefined' : v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
const field = (v) => ({
  t: kind(v),
  v: typeof v === 'string' || typeof v === 'number' ? v : undefined,
  wf: typeof v === 'string' ? v.isWellFormed() : true,
  safe: typeof v === 'number' ? Number.isSafeInteger(v) && !Object.is(v, -0) : undefined,
});
function message(m) {
  const p = get(m, 'params'), a = get(p, 'arguments'), ref = get(p, 'ref');
  return {
    t: kind(m),
    jsonrpc: field(get(m, 'jsonrpc')), method: field(get(m, 'method')), id: field(get(m, 'id')),
    result: own(m, 'result'), error: own(m, 'error'), params: kind(p),
    name: field(get(p, 'name')), uri: field(get(p, 'uri')), args: kind(a), verb: field(get(a, 'verb')),
    ref: kind(ref), refType: field(get(ref, 'type')), refName: field(get(ref, 'name')), refURI: field(get(ref, 'uri')),
    meta: kind(get(p, '_meta')), version: field(get(get(p, '_meta'), 'io.modelcontextprotocol/protocolVersion')),
    requestId: field(get(p, 'requestId')),
    input: own(p, 'inputResponses') || own(p, 'requestState'), state: field(get(p, 'requestState')),
  };
}
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  let out;
  try {
    const v = JSON.parse(dec.decode(Buffer.from(line, 'base64')));
    out = { ok: true, batch: Array.isArray(v), msgs: Array.isArray(v) ? v.map(message) : [message(v)] };
  } catch (e) {
    out = { ok: false };
  }
  process.stdout.write(JSON.stringify(out) + '\n');
});
`

type jsField struct {
	T    string          `json:"t"`
	V    json.RawMessage `json:"v"`
	WF   bool            `json:"wf"`
	Safe *bool           `json:"safe"`
}

func (f jsField) str() (string, bool) {
	var s string
	if f.T != "string" || json.Unmarshal(f.V, &s) != nil {
		return "", false
	}
	return s, true
}

type jsMessage struct {
	T         string  `json:"t"`
	JSONRPC   jsField `json:"jsonrpc"`
	Method    jsField `json:"method"`
	ID        jsField `json:"id"`
	Result    bool    `json:"result"`
	Error     bool    `json:"error"`
	Params    string  `json:"params"`
	Name      jsField `json:"name"`
	URI       jsField `json:"uri"`
	Args      string  `json:"args"`
	Verb      jsField `json:"verb"`
	Ref       string  `json:"ref"`
	RefType   jsField `json:"refType"`
	RefName   jsField `json:"refName"`
	RefURI    jsField `json:"refURI"`
	Meta      string  `json:"meta"`
	Version   jsField `json:"version"`
	Input     bool    `json:"input"`
	State     jsField `json:"state"`
	RequestID jsField `json:"requestId"`
}

type jsReading struct {
	OK    bool        `json:"ok"`
	Batch bool        `json:"batch"`
	Msgs  []jsMessage `json:"msgs"`
}

// TestReadAgreesWithJSONParse: every body Read accepts, Node reads the same
// way (ZIDANE_NODE names the node binary; test.sh sets it).
func TestReadAgreesWithJSONParse(t *testing.T) {
	node := os.Getenv("ZIDANE_NODE")
	if node == "" {
		if os.Getenv("ZIDANE_E2E") == "1" {
			t.Fatal("ZIDANE_NODE is not set")
		}
		t.Skip("ZIDANE_NODE is not set")
	}
	corpus := nodeCorpus(t)

	script := filepath.Join(t.TempDir(), "reader.js")
	if err := os.WriteFile(script, []byte(nodeReader), 0o644); err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	for _, b := range corpus {
		in.WriteString(base64.StdEncoding.EncodeToString(b))
		in.WriteByte('\n')
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.Bytes())
	}

	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	accepted := 0
	for i := 0; sc.Scan(); i++ {
		if i >= len(corpus) {
			t.Fatal("node printed more lines than bodies")
		}
		body, err := Read(corpus[i])
		if err != nil {
			continue
		}
		accepted++
		var js jsReading
		if err := json.Unmarshal(sc.Bytes(), &js); err != nil {
			t.Fatalf("body %d: node printed %q: %v", i, sc.Bytes(), err)
		}
		if why := disagree(body, js); why != "" {
			t.Errorf("body %q: Read and JSON.parse disagree: %s", corpus[i], why)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !t.Failed() {
		t.Logf("%d bodies, %d accepted by Read, each read the same way by Node", len(corpus), accepted)
	}
}

// disagree returns how js reads body differently, or "".
func disagree(body *Body, js jsReading) string {
	if !js.OK {
		return "JSON.parse refuses it"
	}
	if js.Batch != body.Batch || len(js.Msgs) != len(body.Calls) {
		return "batch shape"
	}
	for i, c := range body.Calls {
		m := js.Msgs[i]
		for _, f := range []jsField{m.JSONRPC, m.Method, m.ID, m.Name, m.URI, m.Verb, m.RefType, m.RefName, m.RefURI, m.RequestID} {
			if !f.WF {
				return "JavaScript keeps a lone surrogate"
			}
		}
		if v, _ := m.JSONRPC.str(); m.T != "object" || v != "2.0" {
			return "envelope"
		}
		if method, ok := m.Method.str(); ok != !c.IsResponse() || method != c.Method {
			return "method"
		}
		if c.IsResponse() && m.Result == m.Error {
			return "result or error"
		}
		if !sameJSID(m.ID, c.ID) {
			return "id"
		}
		opt := func(f jsField, ours string) bool {
			s, ok := f.str()
			return ok && s == ours || f.T == "undefined" && ours == ""
		}
		// requestState as a string, or "" when it is absent or another
		// kind of value.
		state := func() bool {
			s, ok := m.State.str()
			return ok && s == c.RequestState || !ok && c.RequestState == ""
		}
		switch c.Method {
		case "tools/call":
			if name, _ := m.Name.str(); name != c.Tool || m.Args != "undefined" && m.Args != "null" && m.Args != "object" || !opt(m.Verb, c.Verb) || m.Input != c.InputResponses || !state() {
				return "tools/call params"
			}
		case "prompts/get":
			if name, ok := m.Name.str(); !ok || name != c.Prompt || m.Input != c.InputResponses || !state() {
				return "prompt"
			}
		case "resources/read", "resources/subscribe", "resources/unsubscribe":
			// A removed method's (2026-07-28) URI may be absent; the
			// version that removed it must read the same.
			version, _ := m.Version.str()
			uri, ok := m.URI.str()
			if removed(c.Method, version) != c.Removed() {
				return "removed"
			}
			if !ok && !(c.Removed() && m.URI.T == "undefined") || uri != c.URI || m.Input != c.InputResponses || !state() {
				return "uri"
			}
		case "completion/complete":
			if m.Ref != "object" || !opt(m.RefType, c.Ref.Type) || !opt(m.RefName, c.Ref.Name) || !opt(m.RefURI, c.Ref.URI) {
				return "ref"
			}
		case "notifications/cancelled":
			if m.Params == "object" && !sameJSID(m.RequestID, c.Cancelled) {
				return "requestId"
			}
		}
		if (c.Meta != nil) != (m.Meta == "object") {
			return "_meta"
		}
	}
	return ""
}

// sameJSID reports whether JavaScript's id f is id.
func sameJSID(f jsField, id ID) bool {
	switch {
	case id.IsZero():
		return f.T == "undefined" || f.T == "null"
	case id.kind == idString:
		s, ok := f.str()
		return ok && s == id.s
	}
	return f.T == "number" && f.Safe != nil && *f.Safe && string(f.V) == strconv.FormatInt(id.n, 10)
}

// nodeCorpus is the table bodies, the fuzz corpus, the threat model's
// hostile bodies, and deterministic mutations of them.
func nodeCorpus(t *testing.T) [][]byte {
	var corpus [][]byte
	for _, r := range readRows {
		corpus = append(corpus, []byte(r.body))
	}
	corpus = append(corpus, readCorpus(t)...)
	corpus = append(corpus, hostileBodies()...)
	// Mutations of accepted bodies are accepted more often, and those are
	// the ones compared.
	var accepted [][]byte
	for _, b := range corpus {
		if _, err := Read(b); err == nil {
			accepted = append(accepted, b)
		}
	}
	rng := rand.New(rand.NewSource(1))
	base := len(corpus)
	for n := 0; n < 800; n++ {
		b := bytes.Clone(corpus[rng.Intn(base)])
		if n%2 == 0 {
			b = bytes.Clone(accepted[rng.Intn(len(accepted))])
		}
		for k := 1 + rng.Intn(2); k > 0; k-- {
			b = mutate(rng, b)
		}
		corpus = append(corpus, b)
	}
	return corpus
}

// mutations insert what readers read differently: case, escapes,
// non-ASCII folds, surrogates, duplicates, numbers.
var mutationTokens = []string{
	`"`, `\`, `\u0041`, `\u017f`, "ſ", "K", `\u212a`, `,`, `:`, `{}`, `[]`, " ", "\n", "1", ".0", "e1", "-",
	"\xff", "é", `\u00e9`, `\ud800`, `\udc00`, `\ud83d\ude00`, "\xef\xbb\xbf", "__proto__", "\x00",
}

var memberTokens = []string{
	`"x":1,`, `"name":"y",`, `"Name":"y",`, `"verb":"v",`, `"VERB":"v",`, `"n\u0061me":"z",`, `"uri":"u",`,
	`"method":"m",`, `"id":2,`, `"_meta":{},`, `"arguments":{},`, `"ref":{"type":"ref/prompt","name":"p"},`,
	`"k":"\u00e9\ud83d\ude00",`, `"a":{"b":1,"B":2},`,
}

func mutate(rng *rand.Rand, b []byte) []byte {
	if len(b) == 0 {
		return append(b, mutationTokens[rng.Intn(len(mutationTokens))]...)
	}
	i := rng.Intn(len(b))
	switch rng.Intn(6) {
	case 0: // flip the case of a letter
		for j := i; j < len(b); j++ {
			if c := b[j]; 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' {
				b[j] ^= 0x20
				break
			}
		}
		return b
	case 1: // insert a token
		tok := mutationTokens[rng.Intn(len(mutationTokens))]
		return append(b[:i], append([]byte(tok), b[i:]...)...)
	case 2: // delete a few bytes
		j := min(len(b), i+1+rng.Intn(3))
		return append(b[:i], b[j:]...)
	case 3: // add a member after an opening brace
		if j := bytes.IndexByte(b[i:], '{'); j >= 0 && i+j+1 < len(b) && b[i+j+1] != '}' {
			k := i + j + 1
			tok := memberTokens[rng.Intn(len(memberTokens))]
			return append(b[:k], append([]byte(tok), b[k:]...)...)
		}
		return b
	case 4: // spell a letter inside a string as an escape
		for j := i; j < len(b); j++ {
			if c := b[j]; 'a' <= c && c <= 'z' {
				esc := []byte(`\u00` + strconv.FormatInt(int64(c), 16))
				return append(b[:j], append(esc, b[j+1:]...)...)
			}
		}
		return b
	default: // duplicate a slice
		j := min(len(b), i+1+rng.Intn(16))
		seg := bytes.Clone(b[i:j])
		return append(b[:j], append(seg, b[j:]...)...)
	}
}
