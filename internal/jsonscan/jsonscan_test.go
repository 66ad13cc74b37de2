package jsonscan

import (
	"encoding/json"
	"testing"
)

var values = []string{
	`{}`, `[]`, `{"a":[1,-2.5e-3,true,false,null,"x\u00e9\"\\"]}`, `"caf\u00e9"`, `0`, `-0.1`, `1E+9`,
	`{"a":}`, `[1,]`, `01`, `1.`, `"\x"`, `"\u12g4"`, `tru`, `{"a" 1}`, "\"a\x01\"", `[` + `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]` + `]`,
}

func TestSkipValueAgreesWithValid(t *testing.T) {
	for _, v := range values {
		s := &Scanner{B: []byte(v)}
		ok := s.SkipValue(0) && s.I == len(v)
		if ok && !json.Valid([]byte(v)) {
			t.Errorf("SkipValue accepts %s, which is not JSON", v)
		}
	}
}

// FuzzSkipValue: what SkipValue accepts whole is valid JSON.
func FuzzSkipValue(f *testing.F) {
	for _, v := range values {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &Scanner{B: b}
		if s.SkipValue(0) {
			s.WS()
			if s.I == len(b) && !json.Valid(b) {
				t.Fatalf("SkipValue accepts %q, which is not JSON", b)
			}
		}
	})
}

func TestFoldsTo(t *testing.T) {
	for _, tc := range []struct {
		key, name string
		want      bool
	}{{"Method", "method", true}, {"method", "method", false}, {"METHOD", "method", true}, {"methods", "method", false}, {"m3thod", "method", false}} {
		if got := FoldsTo(tc.key, tc.name); got != tc.want {
			t.Errorf("FoldsTo(%q, %q) = %v", tc.key, tc.name, got)
		}
	}
}
