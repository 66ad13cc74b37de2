package htmlpage

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
)

// TestPageHeaders is the table of the headers each of the gateway's pages
// must carry, exactly, as each page set them before it used this package:
// what they share, and the policy and referrer each page writes at its
// call site.
func TestPageHeaders(t *testing.T) {
	// The hashes below are openssl's: printf '%s' "$style" | openssl
	// dgst -sha256 -binary | base64.
	const style = "body{margin:0}"
	const script = `document.title="x"`
	pageCSP := MustCSP("style-src "+Hash(style), "form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'")
	for _, tc := range []struct {
		page string
		csp  CSP
		ref  Referrer
		want string // the Content-Security-Policy
	}{
		{"consent (authserver)", MustCSP("style-src 'unsafe-inline'", "base-uri 'none'", "frame-ancestors 'none'"), SameOrigin,
			"default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'"},
		{"refusal (authserver)", MustCSP("style-src 'unsafe-inline'", "base-uri 'none'", "frame-ancestors 'none'"), NoReferrer,
			"default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'"},
		{"sign-in (idp)", pageCSP, SameOrigin,
			"default-src 'none'; style-src 'sha256-IAdwN3biDCQ3brrgp1m8kBEsPQYyqfREKOEfeoREopc='; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
		{"sign-in link (idp)", pageCSP.With("script-src " + Hash(script)), SameOrigin,
			"default-src 'none'; style-src 'sha256-IAdwN3biDCQ3brrgp1m8kBEsPQYyqfREKOEfeoREopc='; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; script-src 'sha256-eawmn9Ja0slk0t23UB0XPhR3DidQg5gBGKEBS+LWEMY='"},
		{"connect link (connect)", MustCSP("style-src "+Hash(style), "frame-ancestors 'none'", "base-uri 'none'"), SameOrigin,
			"default-src 'none'; style-src 'sha256-IAdwN3biDCQ3brrgp1m8kBEsPQYyqfREKOEfeoREopc='; frame-ancestors 'none'; base-uri 'none'"},
		{"connected accounts (accounts)", MustCSP("form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'"), SameOrigin,
			"default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
		{"approval status (approvalpage)", MustCSP("form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'"), SameOrigin,
			"default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
		{"session (sessionpage)", MustCSP("style-src 'unsafe-inline'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"), NoReferrer,
			"default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
	} {
		h := http.Header{}
		SetHeaders(h, tc.csp, tc.ref)
		want := http.Header{
			"Content-Type":            {"text/html; charset=utf-8"},
			"Content-Security-Policy": {tc.want},
			"X-Frame-Options":         {"DENY"},
			"X-Content-Type-Options":  {"nosniff"},
			"Cache-Control":           {"no-store"},
			"Referrer-Policy":         {string(tc.ref)},
		}
		if len(h) != len(want) {
			t.Errorf("%s: %d headers, want %d: %v", tc.page, len(h), len(want), h)
		}
		for k, v := range want {
			if got := h.Values(k); len(got) != 1 || got[0] != v[0] {
				t.Errorf("%s: %s: %q, want %q", tc.page, k, got, v[0])
			}
		}
	}
}

// TestPageHeadersReplace: headers a handler set before, of the same
// names, are replaced, never added to: a page answers one policy.
func TestPageHeadersReplace(t *testing.T) {
	h := http.Header{"Content-Security-Policy": {"default-src *"}, "Referrer-Policy": {"unsafe-url"}, "Content-Type": {"text/plain"}}
	SetHeaders(h, MustCSP("frame-ancestors 'none'", "base-uri 'none'"), NoReferrer)
	if got := h.Values("Content-Security-Policy"); len(got) != 1 || got[0] != "default-src 'none'; frame-ancestors 'none'; base-uri 'none'" {
		t.Errorf("Content-Security-Policy: %q", got)
	}
	if got := h.Values("Referrer-Policy"); len(got) != 1 || got[0] != "no-referrer" {
		t.Errorf("Referrer-Policy: %q", got)
	}
	if got := h.Values("Content-Type"); len(got) != 1 || got[0] != "text/html; charset=utf-8" {
		t.Errorf("Content-Type: %q", got)
	}
}

// TestCSPRefusals: each policy a page could be written with by mistake,
// or that would read two ways, is refused (MustCSP panics, when the
// page's package loads) with a word of why.
func TestCSPRefusals(t *testing.T) {
	fa, bu := "frame-ancestors 'none'", "base-uri 'none'"
	for _, tc := range []struct {
		name       string
		directives []string
		word       string
	}{
		{"no frame-ancestors: the page could be framed", []string{bu}, "frame-ancestors"},
		{"frame-ancestors allows a site", []string{"frame-ancestors https://evil.example", bu}, "frame-ancestors"},
		{"frame-ancestors allows a site, and none", []string{"frame-ancestors https://evil.example", fa, bu}, "twice"},
		{"no base-uri", []string{fa}, "base-uri"},
		{"default-src again: browsers obey the first", []string{"default-src *", fa, bu}, "default-src"},
		{"default-src in capitals", []string{"DEFAULT-SRC *", fa, bu}, "default-src"},
		{"a directive twice", []string{"style-src 'unsafe-inline'", "style-src *", fa, bu}, "twice"},
		{"a directive twice, another case", []string{"style-src 'self'", "Style-Src *", fa, bu}, "twice"},
		{"a second directive smuggled in", []string{"style-src 'self'; script-src *", fa, bu}, "separator"},
		{"a second policy smuggled in", []string{"style-src 'self', script-src *", fa, bu}, "separator"},
		{"a header smuggled in", []string{"style-src 'self'\r\nSet-Cookie: x=1", fa, bu}, "control"},
		{"an empty directive", []string{"", fa, bu}, "empty"},
	} {
		_, err := newCSP(tc.directives)
		if err == nil || !strings.Contains(err.Error(), tc.word) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.word)
		}
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("%s: MustCSP did not panic", tc.name)
				}
			}()
			MustCSP(tc.directives...)
		}()
	}
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Error("With a second script-src did not panic")
			}
		}()
		MustCSP("script-src 'none'", fa, bu).With("script-src *")
	}()
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Error("SetHeaders with the zero CSP did not panic")
			}
		}()
		SetHeaders(http.Header{}, CSP{}, NoReferrer)
	}()
}

// TestHash: the source expression of a known string (CSP3 §2.3.1 hashes
// the UTF-8 bytes, base64 with padding), and one byte more is another.
func TestHash(t *testing.T) {
	// echo -n 'alert(1)' | openssl dgst -sha256 -binary | base64
	if got := Hash("alert(1)"); got != "'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI='" {
		t.Errorf("Hash: %s", got)
	}
	if Hash("alert(1)") == Hash("alert(1) ") {
		t.Error("two scripts share a hash")
	}
}

// TestFormToken: a form's token is the one each page made before it used
// this package (so a form shown before an upgrade still answers after
// it), and is good for the purpose and fields it was made for alone.
func TestFormToken(t *testing.T) {
	key := make([]byte, 32)
	key[0] = 1
	mac := func(msg string) string {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(msg))
		return hex.EncodeToString(m.Sum(nil))
	}
	accounts, err := NewForm("https://signin.example.com", key, "connected accounts")
	if err != nil {
		t.Fatal(err)
	}
	approval, err := NewForm("https://signin.example.com:443/", key, "approval page")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := accounts.Token("alice"), mac("connected accounts\x00alice"); got != want {
		t.Errorf("the accounts page's token: %s, want %s", got, want)
	}
	if got, want := approval.Token("alice", "apv_1"), mac("approval page\x00alice\x00apv_1"); got != want {
		t.Errorf("the approval page's token: %s, want %s", got, want)
	}
	// Two spellings of one origin are one origin, as formpost compares them.
	if accounts.Origin() != "https://signin.example.com:443" || approval.Origin() != accounts.Origin() {
		t.Errorf("origins %q, %q", accounts.Origin(), approval.Origin())
	}
	good := approval.Token("alice", "apv_1")
	if !approval.Valid(good, "alice", "apv_1") {
		t.Fatal("a form's own token is refused")
	}
	other, _ := NewForm("https://signin.example.com", make([]byte, 32), "approval page")
	for _, tc := range []struct {
		name   string
		form   *Form
		token  string
		fields []string
	}{
		{"another person's form", approval, approval.Token("bob", "apv_1"), []string{"alice", "apv_1"}},
		{"another approval's form", approval, approval.Token("alice", "apv_2"), []string{"alice", "apv_1"}},
		{"another page's token", approval, accounts.Token("alice"), []string{"alice"}},
		{"under another key", approval, other.Token("alice", "apv_1"), []string{"alice", "apv_1"}},
		{"altered", approval, good[:len(good)-1] + "0", []string{"alice", "apv_1"}},
		{"in capitals", approval, strings.ToUpper(good), []string{"alice", "apv_1"}},
		{"empty", approval, "", []string{"alice", "apv_1"}},
	} {
		if tc.form.Valid(tc.token, tc.fields...) {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	for _, tc := range []struct {
		name, origin, purpose string
		key                   []byte
		word                  string
	}{
		{"a relative origin", "/signin", "p", key, "origin"},
		{"no scheme", "signin.example.com", "p", key, "origin"},
		{"another scheme", "ftp://signin.example.com", "p", key, "origin"},
		{"a short key", "https://signin.example.com", "p", key[:16], "32 bytes"},
		{"no purpose", "https://signin.example.com", "", key, "purpose"},
		{"a purpose with NUL", "https://signin.example.com", "a\x00b", key, "purpose"},
	} {
		if _, err := NewForm(tc.origin, tc.key, tc.purpose); err == nil || !strings.Contains(err.Error(), tc.word) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.word)
		}
	}
}
