package approvalpage

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
)

const origin = "https://signin.example.com"

// fixture is a page over a store holding alice's call, the browser's
// person read from its X-Test-Person header (the sign-in's cookie, in the
// gateway).
func fixture(t *testing.T) (*Page, *approvals.Store, approvals.Approval, *[]Event) {
	t.Helper()
	st, err := approvals.New(approvals.Options{Store: &certmagic.FileStorage{Path: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := st.Hold(context.Background(), approvals.Call{Rule: "site policy, rule 1", Message: "production deploys need a second person",
		Site: "https://mcp.example.com/mcp", Route: "guard", Method: "tools/call", Tool: "deploy", Owner: "alice", Credential: "tok_alice",
		Arguments: []byte(`{"environment":"production","secret_ref":"vault-7"}`)})
	if err != nil {
		t.Fatal(err)
	}
	people := map[string]Person{"alice": {Owner: "alice", Name: "Alice", Scopes: []string{"approve"}}, "bob": {Owner: "bob", Name: "Bob", Scopes: []string{"approve"}},
		"carol": {Owner: "carol", Name: "Carol"}}
	var events []Event
	p, err := New(Options{Origin: origin, Key: make([]byte, 32), Store: st,
		Current: func(r *http.Request) (Person, bool) {
			who, ok := people[r.Header.Get("X-Test-Person")]
			return who, ok
		},
		May:   func(who Person, _ approvals.Approval) bool { return slices.Contains(who.Scopes, "approve") },
		Audit: func(e Event) { events = append(events, e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, st, a, &events
}

func get(p *Page, id, who string) (int, string, http.Header) {
	r := httptest.NewRequest(http.MethodGet, origin+PathPrefix+id, nil)
	if who != "" {
		r.Header.Set("X-Test-Person", who)
	}
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Body)
	return w.Code, string(b), w.Header()
}

func post(p *Page, id, who, body string, headers map[string]string) (int, string) {
	r := httptest.NewRequest(http.MethodPost, origin+PathPrefix+id, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", origin)
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	if who != "" {
		r.Header.Set("X-Test-Person", who)
	}
	for k, v := range headers {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Body)
	return w.Code, string(b)
}

// TestPageShows: anyone with the address sees the call's tool, its rule's
// message and its state, never its arguments; the caller sees the
// arguments and no buttons; an approver sees the arguments and the
// buttons; the page is never framed nor cached.
func TestPageShows(t *testing.T) {
	p, _, a, _ := fixture(t)
	for _, c := range []struct {
		who           string
		args, buttons bool
		word          string
	}{
		{"", false, false, "sign in"},
		{"carol", false, false, "may not approve"},
		{"alice", true, false, "your call"},
		{"bob", true, true, "run once"},
	} {
		st, body, h := get(p, a.ID, c.who)
		if st != http.StatusOK || !strings.Contains(body, "tool deploy") || !strings.Contains(body, "production deploys need a second person") || !strings.Contains(body, "pending") {
			t.Fatalf("%q: %d %s", c.who, st, body)
		}
		if strings.Contains(body, "vault-7") != c.args || strings.Contains(body, `id="approve"`) != c.buttons || !strings.Contains(body, c.word) {
			t.Errorf("%q sees arguments %v, buttons %v (want %v, %v), word %q: %s", c.who, strings.Contains(body, "vault-7"), strings.Contains(body, `id="approve"`), c.args, c.buttons, c.word, body)
		}
		if h.Get("X-Frame-Options") != "DENY" || !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") || h.Get("Cache-Control") != "no-store" {
			t.Errorf("%q: headers %v", c.who, h)
		}
	}
	if st, _, _ := get(p, "apv_AAAAAAAAAAAAAAAAAAAAAA", "bob"); st != http.StatusNotFound {
		t.Errorf("an unknown approval: %d", st)
	}
}

// TestPageAnswerAttacks: each answer that must not land is refused with
// its status and a word of why, and the approval stays pending; then the
// approver's own answer lands, once.
func TestPageAnswerAttacks(t *testing.T) {
	p, st, a, events := fixture(t)
	token := func(who string) string { return p.formToken(who, a.ID) }
	form := func(decision, tok string) string {
		return url.Values{"decision": {decision}, "token": {tok}}.Encode()
	}
	for _, c := range []struct {
		name, who, body string
		headers         map[string]string
		status          int
		word            string
	}{
		{"a cross-origin post", "bob", form("approve", token("bob")), map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403, "own page"},
		{"a post with no origin at all", "bob", form("approve", token("bob")), map[string]string{"Origin": "", "Sec-Fetch-Site": ""}, 403, "own page"},
		{"the caller approving their own call", "alice", form("approve", token("alice")), nil, 403, "own call"},
		{"a person without the approve scope", "carol", form("approve", token("carol")), nil, 403, "approve scope"},
		{"another person's form token", "carol", form("approve", token("bob")), nil, 403, "not shown to the person"},
		{"the approval's token from another approval", "bob", form("approve", p.formToken("bob", "apv_AAAAAAAAAAAAAAAAAAAAAA")), nil, 403, "not shown to the person"},
		{"signed out", "", form("approve", token("bob")), nil, 403, "not signed in"},
		{"two decisions", "bob", "decision=deny&decision=approve&token=" + token("bob"), nil, 400, "once each"},
		{"a decision of another word", "bob", form("allow", token("bob")), nil, 400, "approve or deny"},
	} {
		status, body := post(p, a.ID, c.who, c.body, c.headers)
		if status != c.status || !strings.Contains(body, c.word) {
			t.Errorf("%s: %d %s, want %d saying %q", c.name, status, body, c.status, c.word)
		}
		if got, _ := st.Get(context.Background(), a.ID); got.State != approvals.Pending {
			t.Fatalf("%s: the approval is %s", c.name, got.State)
		}
	}
	if len(*events) < 5 {
		t.Errorf("the page's refusals were not audited: %+v", *events)
	}
	if status, _ := post(p, a.ID, "bob", form("approve", token("bob")), nil); status != http.StatusSeeOther {
		t.Fatalf("bob's approval: %d", status)
	}
	if got, _ := st.Get(context.Background(), a.ID); got.State != approvals.Approved || got.AnsweredBy != "bob" {
		t.Fatalf("after bob's answer: %+v", got)
	}
	if status, body := post(p, a.ID, "bob", form("deny", token("bob")), nil); status != http.StatusConflict || !strings.Contains(body, "first answer") {
		t.Fatalf("a second answer: %d %s", status, body)
	}
	if _, body, _ := get(p, a.ID, "bob"); !strings.Contains(body, "approved") || strings.Contains(body, `id="approve"`) {
		t.Fatalf("the page after the answer: %s", body)
	}
}
