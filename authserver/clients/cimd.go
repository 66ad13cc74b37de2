package clients

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/pinnedfetch"
)

// Bounds on fetching client ID metadata documents.
const (
	// MaxClientIDLength bounds a client_id URL, in bytes.
	MaxClientIDLength = 1024
	// DefaultFetchTimeout bounds one fetch of a document, body included.
	DefaultFetchTimeout = 5 * time.Second
	// MinDocumentTTL and MaxDocumentTTL bound how long a fetched document
	// is used: its Cache-Control max-age is clamped to them, so a client
	// cannot make the server fetch on every request (no-store, max-age=0)
	// nor keep a document it has since changed for longer than a day.
	MinDocumentTTL = time.Minute
	MaxDocumentTTL = 24 * time.Hour
	// DefaultDocumentTTL is used when the answer has no max-age.
	DefaultDocumentTTL = 10 * time.Minute
	// FailureTTL is how long a client_id whose document could not be
	// fetched or was refused is refused without fetching again.
	FailureTTL = time.Minute
	// MaxCachedDocuments bounds the cache, answers and failures together.
	MaxCachedDocuments = 1024
	// MaxConcurrentFetches bounds the documents fetched at one time; a
	// request beyond it is refused as temporarily_unavailable, not queued.
	MaxConcurrentFetches = 16
)

// documents fetches client ID metadata documents and keeps them.
type documents struct {
	timeout time.Duration
	now     func() time.Time
	// fetchOptions are added after the production options; only tests
	// set them, to reach loopback listeners (see WithResolver).
	fetchOptions []pinnedfetch.Option

	slots chan struct{}
	mu    sync.Mutex
	cache map[string]*document
}

// document is one client_id's fetch: done is closed when client or err is
// set; a fetch in flight is shared by every request for its client_id.
type document struct {
	done    chan struct{}
	client  Client
	err     error
	expires time.Time
}

func newDocuments(timeout time.Duration, now func() time.Time) *documents {
	return &documents{
		timeout: timeout,
		now:     now,
		slots:   make(chan struct{}, MaxConcurrentFetches),
		cache:   map[string]*document{},
	}
}

// checkClientIDURL says what is wrong with id as the URL of a client ID
// metadata document (draft-ietf-oauth-client-id-metadata-document §3):
// https, a host, a path other than /, no dot segments, no fragment, no
// userinfo; and, stricter than the draft, no query, so that one document
// has one URL.
func checkClientIDURL(id string) *Error {
	bad := func(reason, description string) *Error {
		return refuse(CodeInvalidClient, reason, "client_id: "+description)
	}
	if len(id) > MaxClientIDLength {
		return bad("length", "a client_id URL is at most "+strconv.Itoa(MaxClientIDLength)+" bytes")
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c == '#' {
			return bad("fragment", "a client_id URL has no fragment (#)")
		}
		if c <= ' ' || c >= 0x7f || c == '\\' {
			return bad("characters", "a client_id URL is printable ASCII without spaces or backslashes; percent-encode the rest")
		}
	}
	if strings.HasPrefix(id, "http://") {
		return bad("http_client_id", "a client_id URL must use https (a metadata document is only trusted from its domain's TLS certificate)")
	}
	if !strings.HasPrefix(id, "https://") {
		return bad("scheme", "a client_id URL starts with https://, in lower case")
	}
	u, err := url.Parse(id)
	if err != nil {
		return bad("parse", "the client_id URL does not parse")
	}
	if u.User != nil {
		return bad("userinfo", "a client_id URL has no userinfo (user@ or user:password@)")
	}
	if u.RawQuery != "" || u.ForceQuery {
		return bad("query", "a client_id URL has no query; host the document at a path of its own")
	}
	if why := checkHost(u.Host, u.Hostname()); why != "" {
		return bad("host", "the URL "+why)
	}
	if why := checkPort(u.Host, u.Port()); why != "" {
		return bad("port", "the URL "+why)
	}
	if p := u.EscapedPath(); p == "" || p == "/" {
		return bad("root_path", "a client_id URL has a path (such as /oauth/client.json), not just /")
	}
	if hasDotSegment(u.EscapedPath()) {
		return bad("path", "a client_id URL has no . or .. path segments")
	}
	return nil
}

// resolve returns the client of the metadata document at id, from the
// cache or fetched.
func (d *documents) resolve(ctx context.Context, id string) (Client, error) {
	if err := checkClientIDURL(id); err != nil {
		return Client{}, err
	}
	now := d.now()
	d.mu.Lock()
	doc := d.cache[id]
	if doc != nil {
		select {
		case <-doc.done:
			if now.After(doc.expires) {
				delete(d.cache, id)
				doc = nil
			}
		default:
		}
	}
	owner := doc == nil
	if owner {
		d.evict(now)
		doc = &document{done: make(chan struct{})}
		d.cache[id] = doc
	}
	d.mu.Unlock()
	if owner {
		// The fetch outlives the request that started it (others may be
		// waiting on it, and the next request will want its answer) but
		// not its own time bound.
		go func() {
			doc.client, doc.expires, doc.err = d.fetch(context.WithoutCancel(ctx), id)
			if Reason(doc.err) == "busy" {
				d.mu.Lock()
				delete(d.cache, id)
				d.mu.Unlock()
			}
			close(doc.done)
		}()
	}
	select {
	case <-doc.done:
		c := doc.client
		// Every caller gets its own slice: the cached client stays as fetched.
		c.RedirectURIs = slices.Clone(c.RedirectURIs)
		return c, doc.err
	case <-ctx.Done():
		return Client{}, &Error{Code: CodeTemporarilyUnavailable, Reason: "cancelled", Description: "the request ended before the client's metadata document arrived", Err: ctx.Err()}
	}
}

// evict makes room for one entry: expired entries go first, then any
// finished one. Called with d.mu held.
func (d *documents) evict(now time.Time) {
	if len(d.cache) < MaxCachedDocuments {
		return
	}
	for id, doc := range d.cache {
		select {
		case <-doc.done:
			if now.After(doc.expires) {
				delete(d.cache, id)
			}
		default:
		}
	}
	for id, doc := range d.cache {
		if len(d.cache) < MaxCachedDocuments {
			return
		}
		select {
		case <-doc.done:
			delete(d.cache, id)
		default:
		}
	}
}

// fetch gets and checks the document at id, and says until when the
// answer (a client or a refusal) holds.
func (d *documents) fetch(ctx context.Context, id string) (Client, time.Time, error) {
	select {
	case d.slots <- struct{}{}:
		defer func() { <-d.slots }()
	default:
		return Client{}, time.Time{}, refuse(CodeTemporarilyUnavailable, "busy", "too many client metadata documents are being fetched at once; try again in a moment")
	}
	c, ttl, err := d.get(ctx, id)
	now := d.now()
	if err != nil {
		return Client{}, now.Add(FailureTTL), err
	}
	return c, now.Add(ttl), nil
}

func documentError(reason, description string, cause error) *Error {
	return &Error{Code: CodeInvalidClient, Reason: reason, Description: "the client's metadata document (its client_id URL) " + description, Err: cause}
}

func (d *documents) get(ctx context.Context, id string) (Client, time.Duration, error) {
	opts := append([]pinnedfetch.Option{
		pinnedfetch.WithMaxRedirects(0),
		pinnedfetch.DenyPrivateAddresses(true),
	}, d.fetchOptions...)
	hc, err := pinnedfetch.New(id, nil, opts...)
	if err != nil {
		return Client{}, 0, documentError("fetch", "cannot be fetched by this server", err)
	}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, id, nil)
	if err != nil {
		return Client{}, 0, documentError("fetch", "cannot be fetched by this server", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return Client{}, 0, fetchError(ctx, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return Client{}, 0, documentError("redirect", "answered with a redirect; serve the document at its client_id URL itself (redirects are not followed)", nil)
	case resp.StatusCode != http.StatusOK:
		return Client{}, 0, documentError("status", "answered HTTP "+strconv.Itoa(resp.StatusCode)+"; serve it with 200", nil)
	}
	mt, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" || (params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8")) {
		return Client{}, 0, documentError("content_type", "is not served as application/json", nil)
	}
	if resp.ContentLength > MaxMetadataBytes {
		return Client{}, 0, documentError("too_large", "is larger than "+strconv.Itoa(MaxMetadataBytes)+" bytes", nil)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxMetadataBytes+1))
	if err == nil && ctx.Err() != nil {
		// The time bound ended the body, which may then read as a clean
		// end: a truncated document is a slow one, not a malformed one.
		err = ctx.Err()
	}
	if err != nil {
		return Client{}, 0, fetchError(ctx, err)
	}
	if len(body) > MaxMetadataBytes {
		return Client{}, 0, documentError("too_large", "is larger than "+strconv.Itoa(MaxMetadataBytes)+" bytes", nil)
	}
	m, err := parseMetadata(body)
	if err != nil {
		var e *Error
		errors.As(err, &e)
		return Client{}, 0, documentError(e.Reason, "was refused: "+e.Description, nil)
	}
	if !m.hasClientID || m.clientID != id {
		return Client{}, 0, documentError("client_id_mismatch", "names another client_id than its own URL; its client_id member must equal the URL exactly", nil)
	}
	return Client{
		ID:           id,
		Name:         m.name,
		RedirectURIs: m.redirectURIs,
		Source:       SourceMetadataDocument,
		LogoURI:      m.logoURI,
		ClientURI:    m.clientURI,
		Scope:        m.scope,
	}, documentTTL(resp.Header), nil
}

// fetchError names why a fetch failed, without the URL's query or the
// resolved address beyond what the address guard reports.
func fetchError(ctx context.Context, err error) *Error {
	var de *pinnedfetch.DialError
	var re *pinnedfetch.RedirectError
	switch {
	case errors.As(err, &de):
		return documentError("private_address", "resolves to an address this server does not fetch from ("+de.Rule+"); host it at a public address", err)
	case errors.As(err, &re):
		return documentError("redirect", "answered with a redirect; serve the document at its client_id URL itself (redirects are not followed)", err)
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return documentError("timeout", "did not arrive in time; serve it faster", err)
	}
	return documentError("fetch", "could not be fetched; check that it is served over https at a public address", err)
}

// documentTTL is how long an answer with header h is used: its max-age,
// clamped to [MinDocumentTTL, MaxDocumentTTL]; DefaultDocumentTTL when it
// has none; MinDocumentTTL when it says no-store or no-cache, or names
// max-age twice.
func documentTTL(h http.Header) time.Duration {
	ttl, seen := DefaultDocumentTTL, false
	for _, line := range h.Values("Cache-Control") {
		for dir := range strings.SplitSeq(line, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(dir), "=")
			switch strings.ToLower(name) {
			case "no-store", "no-cache":
				return MinDocumentTTL
			case "max-age":
				n, err := strconv.ParseInt(strings.Trim(value, `"`), 10, 64)
				if err != nil || seen {
					return MinDocumentTTL
				}
				seen = true
				ttl = time.Duration(min(n, int64(MaxDocumentTTL/time.Second))) * time.Second
			}
		}
	}
	return max(MinDocumentTTL, min(ttl, MaxDocumentTTL))
}
