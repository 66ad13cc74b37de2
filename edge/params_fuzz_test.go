package edge

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math"
	"strconv"
	"testing"

	"github.com/Tahul/caddy-zidane-mcp/message"
)

// decodedParamValue is paramValue as encoding/json reads the arguments,
// which is go-sdk's reading (lookupArgument, unmarshalPrimitive) of a
// message the edge accepted: the reference paramValue must agree with.
func decodedParamValue(arguments []byte, path []string) (string, bool, bool) {
	cur := json.RawMessage(arguments)
	for _, part := range path {
		var obj map[string]json.RawMessage
		if json.Unmarshal(cur, &obj) != nil {
			return "", false, false
		}
		var ok bool
		if cur, ok = obj[part]; !ok {
			return "", false, false
		}
	}
	if string(bytes.TrimSpace(cur)) == "null" {
		return "", false, false
	}
	var v any
	if json.Unmarshal(cur, &v) != nil {
		return "", true, false
	}
	switch v := v.(type) {
	case string:
		if needsBase64(v) {
			v = "=?base64?" + base64.StdEncoding.EncodeToString([]byte(v)) + "?="
		}
		return v, true, true
	case bool:
		return strconv.FormatBool(v), true, true
	case float64:
		const maxSafe = 1<<53 - 1
		if v != math.Trunc(v) || v < -maxSafe || v > maxSafe {
			return "", true, false
		}
		return strconv.FormatInt(int64(v), 10), true, true
	}
	return "", true, false
}

// FuzzParamValue: on every tools/call the one reader accepts, the header
// value paramValue binds to an argument is the one go-sdk's reading gives.
func FuzzParamValue(f *testing.F) {
	for _, s := range []string{`{"a":"x"}`, `{"a":{"b":12}}`, `{"a":1e400}`, `{"a":" pad "}`, `{"\u0061":"é"}`,
		`{"a":true,"b":null}`, `{"a":[1]}`, `{"a":-0}`, `{"a":9007199254740993}`, `{"a":"=?base64?eA==?="}`, `{"a":1.0}`} {
		f.Add(s, "a", "b")
	}
	f.Fuzz(func(t *testing.T, args, p1, p2 string) {
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":` + args + `}}`
		b, err := message.Read([]byte(body))
		if err != nil || len(b.Calls[0].Arguments) == 0 {
			return
		}
		for _, path := range [][]string{{p1}, {p1, p2}} {
			v, present, sendable := paramValue(b.Calls[0].Arguments, path)
			wv, wp, ws := decodedParamValue(b.Calls[0].Arguments, path)
			if v != wv || present != wp || sendable != ws {
				t.Fatalf("%s at %q: %q %v %v; go-sdk's reading: %q %v %v", args, path, v, present, sendable, wv, wp, ws)
			}
		}
	})
}
