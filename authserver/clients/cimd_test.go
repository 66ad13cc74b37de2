package clients

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// goodDoc is a valid metadata document for the client_id id.
func goodDoc(id string) string {
	return `{"client_id":"` + id + `","client_name":"Test Client","redirect_uris":["http://127.0.0.1/callback","https://app.example.com/cb"],"token_endpoint_auth_method":"none","grant_types":["authorization_code","refresh_token"],"response_types":["code"]}`
}

// TestMetadataDocumentAttacks is what a client (or whoever controls the
// URL it names) can put behind a client_id, and what the registry must
// refuse: each row the refusal's reason, and that the document was not
// fetched when the URL alone is enough to refuse.
func TestMetadataDocumentAttacks(t *testing.T) {
	d := newDocServer(t)
	big := `{"client_id":"` + d.url("/big.json") + `","redirect_uris":["https://app.example.com/cb"],"pad":"` + strings.Repeat("a", MaxMetadataBytes) + `"}`
	d.serveJSON("/big.json", big)
	d.mux.HandleFunc("/big-chunked.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for i := 0; i < 40; i++ {
			w.Write([]byte(strings.Repeat(" ", 1024)))
			http.NewResponseController(w).Flush()
		}
	})
	d.mux.HandleFunc("/slow.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"client_id":`))
		http.NewResponseController(w).Flush()
		<-r.Context().Done() // the rest never comes: the fetch's time bound ends it
	})
	d.mux.HandleFunc("/moved.json", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/target.json", http.StatusFound)
	})
	d.serveJSON("/target.json", goodDoc(d.url("/target.json")))
	d.mux.HandleFunc("/html.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte(goodDoc(d.url("/html.json"))))
	})
	d.mux.HandleFunc("/missing.json", http.NotFound)
	serve := func(path, body string) string { d.serveJSON(path, body); return d.url(path) }
	doc := func(path string, edit func(id string) string) string { return serve(path, edit(d.url(path))) }

	tests := []struct {
		name     string
		clientID string
		reason   string
		fetched  bool // whether the URL is fetched before the refusal
	}{
		{"document too large", d.url("/big.json"), "too_large", true},
		{"document too large, no Content-Length", d.url("/big-chunked.json"), "too_large", true},
		{"document too slow", d.url("/slow.json"), "timeout", true},
		{"redirect", d.url("/moved.json"), "redirect", true},
		{"wrong content type", d.url("/html.json"), "content_type", true},
		{"not found", d.url("/missing.json"), "status", true},
		{"client_id differs from the URL", serve("/other.json", goodDoc(d.url("/another.json"))), "client_id_mismatch", true},
		{"client_id differs by a trailing slash", serve("/slash.json", goodDoc(d.url("/slash.json/"))), "client_id_mismatch", true},
		{"client_id missing", serve("/noid.json", `{"redirect_uris":["https://app.example.com/cb"]}`), "client_id_mismatch", true},
		{"client_secret_basic", doc("/basic.json", func(id string) string {
			return strings.Replace(goodDoc(id), `"none"`, `"client_secret_basic"`, 1)
		}), "auth_method", true},
		{"private_key_jwt", doc("/pkjwt.json", func(id string) string {
			return strings.Replace(goodDoc(id), `"none"`, `"private_key_jwt"`, 1)
		}), "auth_method", true},
		{"client_secret member", doc("/secret.json", func(id string) string {
			return strings.Replace(goodDoc(id), `{`, `{"client_secret":"s3cret-value",`, 1)
		}), "secret", true},
		{"duplicate client_id", doc("/dup.json", func(id string) string {
			return strings.Replace(goodDoc(id), `{`, `{"client_id":"https://evil.example.com/x.json",`, 1)
		}), "ambiguous", true},
		{"duplicate redirect_uris by case", doc("/dupcase.json", func(id string) string {
			return strings.Replace(goodDoc(id), `{`, `{"REDIRECT_URIS":["https://evil.example.com/cb"],`, 1)
		}), "ambiguous", true},
		{"redirect_uris in another case alone", serve("/case.json", `{"client_id":"`+d.url("/case.json")+`","Redirect_uris":["https://app.example.com/cb"]}`), "ambiguous", true},
		{"no redirect_uris", serve("/nored.json", `{"client_id":"`+d.url("/nored.json")+`"}`), "redirect_uris", true},
		{"http redirect URI off loopback", doc("/httpred.json", func(id string) string {
			return strings.Replace(goodDoc(id), `https://app.example.com/cb`, `http://app.example.com/cb`, 1)
		}), "http_off_loopback", true},
		{"redirect URI with a fragment", doc("/fragred.json", func(id string) string {
			return strings.Replace(goodDoc(id), `https://app.example.com/cb`, `https://app.example.com/cb#x`, 1)
		}), "fragment", true},
		{"redirect URI with userinfo", doc("/userred.json", func(id string) string {
			return strings.Replace(goodDoc(id), `https://app.example.com/cb`, `https://u:p@app.example.com/cb`, 1)
		}), "userinfo", true},
		{"private-use redirect scheme", doc("/scheme.json", func(id string) string {
			return strings.Replace(goodDoc(id), `https://app.example.com/cb`, `cursor://x/cb`, 1)
		}), "scheme", true},
		{"javascript logo", doc("/logo.json", func(id string) string {
			return strings.Replace(goodDoc(id), `{`, `{"logo_uri":"javascript:alert(1)",`, 1)
		}), "logo_uri", true},
		{"right-to-left override in the name", doc("/rtl.json", func(id string) string {
			return strings.Replace(goodDoc(id), `Test Client`, `Test \u202eClient`, 1)
		}), "client_name", true},
		{"not JSON", serve("/notjson.json", `{"client_id":`), "json", true},
		{"an array", serve("/array.json", `[]`), "json", true},
		{"client credentials only", doc("/cc.json", func(id string) string {
			return strings.Replace(goodDoc(id), `"grant_types":["authorization_code","refresh_token"]`, `"grant_types":["client_credentials"]`, 1)
		}), "grant_types", true},
		{"implicit grant", doc("/implicit.json", func(id string) string {
			return strings.Replace(goodDoc(id), `"response_types":["code"]`, `"response_types":["token"]`, 1)
		}), "response_types", true},

		{"root path", d.url("/"), "root_path", false},
		{"no path", d.url(""), "root_path", false},
		{"http client_id", strings.Replace(d.url("/good.json"), "https://", "http://", 1), "http_client_id", false},
		{"upper-case scheme", strings.Replace(d.url("/good.json"), "https://", "HTTPS://", 1), "scheme", false},
		{"fragment", d.url("/good.json#x"), "fragment", false},
		{"userinfo", strings.Replace(d.url("/good.json"), "https://", "https://u:p@", 1), "userinfo", false},
		{"query", d.url("/good.json?v=1"), "query", false},
		{"dot segment", d.url("/x/../good.json"), "path", false},
		{"encoded dot segment", d.url("/x/%2E%2e/good.json"), "path", false},
		{"numeric host", "https://2130706433/good.json", "host", false},
		{"too long", d.url("/" + strings.Repeat("a", MaxClientIDLength)), "length", false},
		{"not a URL", "my-client", "unknown_client", false},
		{"a registered id that does not exist", "zdc_AAAAAAAAAAAAAAAAAAAAAA", "unknown_client", false},
		{"a registered id with a path", "zdc_../../../../etc/passwd", "unknown_client", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _, rec := testRegistry(t, Config{FetchTimeout: 500 * time.Millisecond})
			reach(r, d)
			path := ""
			if i := strings.Index(tt.clientID, docHost); i >= 0 {
				if j := strings.IndexByte(tt.clientID[i:], '/'); j >= 0 {
					path = tt.clientID[i+j:]
				}
			}
			before := d.hitsOf(path)
			_, err := r.Resolve(context.Background(), tt.clientID)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a refusal (%s)", err, tt.reason)
			}
			if e.Code != CodeInvalidClient || e.Reason != tt.reason {
				t.Errorf("got %s/%s (%v), want %s/%s", e.Code, e.Reason, e, CodeInvalidClient, tt.reason)
			}
			if fetched := d.hitsOf(path) > before; fetched != tt.fetched {
				t.Errorf("fetched = %v, want %v", fetched, tt.fetched)
			}
			if tt.reason == "redirect" && d.hitsOf("/target.json") != 0 {
				t.Errorf("the redirect was followed")
			}
			evs := rec.all()
			if len(evs) != 1 || evs[0].Kind != "resolve" || evs[0].Reason != tt.reason || evs[0].Code != CodeInvalidClient {
				t.Errorf("audit = %+v, want one resolve refusal for %s", evs, tt.reason)
			}
			for _, ev := range evs {
				if strings.Contains(ev.ClientID, "u:p@") || strings.Contains(ev.ClientID, "v=1") {
					t.Errorf("audit shows userinfo or a query: %q", ev.ClientID)
				}
			}
			if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "evil") {
				t.Errorf("the error quotes the document: %q", err)
			}
		})
	}
}

// TestMetadataDocumentOnPrivateAddress has the client_id's host resolve
// to 10.0.0.1: the address guard refuses before dialing, and the dial
// check under it (which would refuse anything off loopback) never sees
// the address.
func TestMetadataDocumentOnPrivateAddress(t *testing.T) {
	r, _, rec := testRegistry(t, Config{})
	var dialed []string
	var resolved []string
	r.docs.fetchOptions = []pinnedfetch.Option{
		pinnedfetch.WithResolver(func(_ context.Context, host, port string) ([]netip.AddrPort, error) {
			resolved = append(resolved, host)
			return []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:443")}, nil
		}),
		pinnedfetch.WithDialCheck(func(address string) error {
			dialed = append(dialed, address)
			return loopbackOnly(address)
		}),
	}
	_, err := r.Resolve(context.Background(), "https://intranet.example.com/client.json")
	if Reason(err) != "private_address" {
		t.Fatalf("got %v (reason %q), want private_address", err, Reason(err))
	}
	if !strings.Contains(err.Error(), "private address") {
		t.Errorf("the error does not name the rule: %q", err)
	}
	if len(resolved) != 1 || len(dialed) != 0 {
		t.Errorf("resolved %v, dialed %v: want one lookup and no dial past the guard", resolved, dialed)
	}
	if evs := rec.all(); len(evs) != 1 || evs[0].Reason != "private_address" {
		t.Errorf("audit = %+v", evs)
	}
}

// TestMetadataDocumentAccepted resolves a valid document, and keeps it for
// its max-age within the bounds: a second resolution does not fetch, one
// after the document's lifetime does.
func TestMetadataDocumentAccepted(t *testing.T) {
	d := newDocServer(t)
	id := d.url("/oauth/client.json")
	d.mux.HandleFunc("/oauth/client.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("Cache-Control", "public, max-age=300")
		// A grant this server does not have is ignored, not refused.
		w.Write([]byte(strings.Replace(goodDoc(id), `"refresh_token"]`, `"refresh_token","urn:ietf:params:oauth:grant-type:device_code"]`, 1)))
	})
	r, clk, rec := testRegistry(t, Config{})
	reach(r, d)
	c, err := r.Resolve(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if c.ClientID() != id || c.Source != SourceMetadataDocument || c.Name != "Test Client" || c.DisplayName() != "Test Client" || c.Host() != docHost+":"+strconv.Itoa(int(d.port)) {
		t.Errorf("client = %+v (display %q, host %q)", c, c.DisplayName(), c.Host())
	}
	if !c.AllowsRedirect("http://127.0.0.1:49152/callback") || !c.AllowsRedirect("https://app.example.com/cb") || c.AllowsRedirect("https://app.example.com/cb2") {
		t.Errorf("redirects not as registered")
	}
	if _, err := r.Resolve(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if n := d.hitsOf("/oauth/client.json"); n != 1 {
		t.Errorf("fetched %d times within max-age, want 1", n)
	}
	clk.advance(301 * time.Second)
	if _, err := r.Resolve(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if n := d.hitsOf("/oauth/client.json"); n != 2 {
		t.Errorf("fetched %d times after max-age, want 2", n)
	}
	if evs := rec.all(); len(evs) != 0 {
		t.Errorf("refusals: %+v", evs)
	}
}

// TestMetadataDocumentFailureCached: a refused document is refused again
// without a fetch for FailureTTL, so a client cannot make the server fetch
// on every authorization request; then it is fetched again.
func TestMetadataDocumentFailureCached(t *testing.T) {
	d := newDocServer(t)
	d.mux.HandleFunc("/flaky.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
	})
	r, clk, _ := testRegistry(t, Config{})
	reach(r, d)
	id := d.url("/flaky.json")
	for range 3 {
		if _, err := r.Resolve(context.Background(), id); Reason(err) != "content_type" {
			t.Fatalf("got %v", err)
		}
	}
	if n := d.hitsOf("/flaky.json"); n != 1 {
		t.Errorf("fetched %d times within the failure lifetime, want 1", n)
	}
	clk.advance(FailureTTL + time.Second)
	r.Resolve(context.Background(), id)
	if n := d.hitsOf("/flaky.json"); n != 2 {
		t.Errorf("fetched %d times after the failure lifetime, want 2", n)
	}
}

// TestDocumentTTL is how an answer's Cache-Control sets how long its
// document is used.
func TestDocumentTTL(t *testing.T) {
	tests := []struct {
		header []string
		want   time.Duration
	}{
		{nil, DefaultDocumentTTL},
		{[]string{"max-age=300"}, 5 * time.Minute},
		{[]string{"public, max-age=0"}, MinDocumentTTL},
		{[]string{"max-age=31536000"}, MaxDocumentTTL},
		{[]string{"max-age=99999999999999999999"}, MinDocumentTTL},
		{[]string{"no-store"}, MinDocumentTTL},
		{[]string{"max-age=600", "no-cache"}, MinDocumentTTL},
		{[]string{"max-age=600, max-age=60000"}, MinDocumentTTL},
		{[]string{`max-age="600"`}, 10 * time.Minute},
		{[]string{"max-age=-5"}, MinDocumentTTL},
	}
	for _, tt := range tests {
		h := http.Header{"Cache-Control": tt.header}
		if got := documentTTL(h); got != tt.want {
			t.Errorf("%q: %v, want %v", tt.header, got, tt.want)
		}
	}
}

// TestMetadataDocumentFetchesBounded: with MaxConcurrentFetches documents
// being fetched (their servers hold the answers), one more client_id is
// refused as busy without a fetch, and is not remembered as refused: once
// the fetches end, it resolves.
func TestMetadataDocumentFetchesBounded(t *testing.T) {
	d := newDocServer(t)
	arrived := make(chan struct{}, MaxConcurrentFetches+1)
	release := make(chan struct{})
	d.mux.HandleFunc("/held/", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(goodDoc(d.url(r.URL.Path))))
	})
	r, _, rec := testRegistry(t, Config{FetchTimeout: time.Minute})
	reach(r, d)
	errs := make(chan error, MaxConcurrentFetches)
	for i := range MaxConcurrentFetches {
		go func() {
			_, err := r.Resolve(context.Background(), d.url("/held/"+strconv.Itoa(i)+".json"))
			errs <- err
		}()
	}
	timeout := time.After(30 * time.Second)
	for range MaxConcurrentFetches {
		select {
		case <-arrived:
		case <-timeout:
			close(release)
			t.Fatal("the held fetches did not all arrive")
		}
	}
	extra := d.url("/held/extra.json")
	_, err := r.Resolve(context.Background(), extra)
	if Reason(err) != "busy" || codeOf(err) != CodeTemporarilyUnavailable {
		close(release)
		t.Fatalf("got %v, want busy", err)
	}
	if d.hitsOf("/held/extra.json") != 0 {
		t.Errorf("the extra document was fetched")
	}
	close(release)
	for range MaxConcurrentFetches {
		if err := <-errs; err != nil {
			t.Errorf("held fetch: %v", err)
		}
	}
	if _, err := r.Resolve(context.Background(), extra); err != nil {
		t.Errorf("after the fetches ended: %v", err)
	}
	if evs := rec.all(); len(evs) != 1 || evs[0].Reason != "busy" {
		t.Errorf("audit = %+v", evs)
	}
}

// TestMetadataDocumentFetchOutlivesItsRequest: a request that ends while
// its client's document is being fetched is answered at once, and the
// fetch goes on for the next request, which then does not fetch again.
func TestMetadataDocumentFetchOutlivesItsRequest(t *testing.T) {
	d := newDocServer(t)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	id := d.url("/held.json")
	d.mux.HandleFunc("/held.json", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(goodDoc(id)))
	})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the server's Close
	r, _, _ := testRegistry(t, Config{FetchTimeout: time.Minute})
	reach(r, d)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() {
		_, err := r.Resolve(ctx, id)
		errs <- err
	}()
	<-arrived
	cancel()
	select {
	case err := <-errs:
		if Reason(err) != "cancelled" {
			t.Fatalf("got %v, want cancelled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the ended request was not answered while its document was held")
	}
	once.Do(func() { close(release) })
	c, err := r.Resolve(context.Background(), id)
	if err != nil || c.ClientID() != id {
		t.Fatalf("got %+v, %v", c, err)
	}
	if n := d.hitsOf("/held.json"); n != 1 {
		t.Errorf("fetched %d times, want 1", n)
	}
}
