package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestInspect(t *testing.T) {
	cases := []struct {
		name  string
		body  string
		batch bool
		want  []Call
	}{
		{"initialize", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, false,
			[]Call{{Method: "initialize", ID: []byte("1")}}},
		{"tool call with verb", `{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"sessions","arguments":{"verb":"create","prompt":"hi"}}}`, false,
			[]Call{{Method: "tools/call", ID: []byte(`"a"`), Tool: "sessions", Verb: "create"}}},
		{"tool call without verb", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"message":"x"}}}`, false,
			[]Call{{Method: "tools/call", ID: []byte("2"), Tool: "echo"}}},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, false,
			[]Call{{Method: "notifications/initialized"}}},
		{"response to server request", `{"jsonrpc":"2.0","id":5,"result":{}}`, false,
			[]Call{{ID: []byte("5")}}},
		{"batch", ` [{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"deploy_prod"}}]`, true,
			[]Call{{Method: "ping", ID: []byte("1")}, {Method: "tools/call", ID: []byte("2"), Tool: "deploy_prod"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, batch, err := Inspect([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if batch != c.batch || len(got) != len(c.want) {
				t.Fatalf("got %+v batch=%v", got, batch)
			}
			for i := range got {
				g, w := got[i], c.want[i]
				if g.Method != w.Method || g.Tool != w.Tool || g.Verb != w.Verb || string(g.ID) != string(w.ID) {
					t.Errorf("call %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func TestInspectMalformed(t *testing.T) {
	secret := "zds_SECRETSECRET"
	for _, body := range []string{
		``, `   `, `{`, `[]`, `"str"`, `42`, `null`,
		`{"id":1,"method":"ping"}`,
		`{"jsonrpc":"1.0","id":1,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1}`,
		`{"jsonrpc":"2.0","id":1,"method":""}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":7}}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}, 3]`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","params":"` + secret,
		`{"jsonrpc":"2.0","method":5}`,
	} {
		_, _, err := Inspect([]byte(body))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("Inspect(%q) err = %v, want ErrMalformed", body, err)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error echoes the body: %v", err)
		}
	}
}

func FuzzInspect(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"read"}}}`))
	f.Add([]byte(`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		calls, _, err := Inspect(body)
		if err == nil && len(calls) == 0 {
			t.Fatal("no error and no calls")
		}
		for _, c := range calls {
			if c.IsToolCall() && c.Tool == "" {
				t.Fatal("tools/call without a tool name accepted")
			}
		}
	})
}

func BenchmarkInspect4KiB(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"sessions","arguments":{"verb":"send","sessionId":"s_123","prompt":"` + strings.Repeat("lorem ipsum ", 330) + `"}}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		calls, _, err := Inspect(body)
		if err != nil || calls[0].Verb != "send" {
			b.Fatal(err)
		}
	}
}
