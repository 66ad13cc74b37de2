package pinnedfetch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Redirect refusals. A *[RedirectError] wraps one of these, or a *[URLError]
// when the target breaks the remote-URL rule; test with errors.Is / errors.As.
var (
	ErrDowngrade          = errors.New("HTTPS to HTTP downgrade is never followed; make the server redirect to https://")
	ErrTooManyRedirects   = errors.New("too many redirects; configure the final URL instead of a chain")
	ErrRedirectLoop       = errors.New("redirect loop: this request was already made in the chain; fix the server's redirects")
	ErrBodyNotReplayable  = errors.New("a 307/308 redirect needs the request body again, but it cannot be replayed; set Request.GetBody (http.NewRequest does for bytes.Reader, strings.Reader and bytes.Buffer bodies)")
	ErrBadLocation        = errors.New("the Location header is not a valid URL; fix the server's redirect")
	errOffOriginInjection = errors.New("the credential layer sent a request off the pinned origin")
)

// RedirectError reports a redirect hop the pinned client refused to follow.
// Its URLs carry no userinfo, query values or fragment.
type RedirectError struct {
	// Hop is the number of the refused redirect (1 for the first).
	Hop int
	// Status is the redirect status code.
	Status int
	// From is the URL that answered with the redirect.
	From string
	// To is the redirect target, or "" when the Location did not parse.
	To string
	// Err is the rule that refused the hop.
	Err error
}

func (e *RedirectError) Error() string {
	to := e.To
	if to == "" {
		to = "an unusable Location"
	}
	rule := e.Err.Error()
	var ue *URLError
	if errors.As(e.Err, &ue) {
		rule = "remote-URL rule: " + ue.Reason
	}
	return fmt.Sprintf("pinnedfetch: refused redirect hop %d (%d from %s to %s): %s", e.Hop, e.Status, e.From, to, rule)
}

func (e *RedirectError) Unwrap() error { return e.Err }

// transport follows redirects itself so that each hop is judged before it is
// sent. It sits above the credential layer: what a hop carries is decided
// here, and a hop without credentials never reaches the layer that adds them.
type transport struct {
	pinned       *url.URL
	origin       string // Origin(pinned), computed once
	sensitive    map[string]bool
	maxRedirects int
	decisions    func(Decision)

	// network dials with the address guard; hops without credentials use it.
	network *http.Transport
	// credentialed is WithCredentials' layer over network, or network.
	credentialed http.RoundTripper
	// cloneFirst protects the caller's request from a credential layer that
	// edits requests in place, since later hops copy the caller's headers.
	cloneFirst bool
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the pool.
func (t *transport) CloseIdleConnections() { t.network.CloseIdleConnections() }

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := CheckRemoteURL(req.URL); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		t.report(Decision{To: redactURL(req.URL), Action: ActionRefuse, Reason: err.Error()})
		return nil, err
	}
	onOrigin := t.onOrigin(req.URL)
	first, rt := req, t.credentialed
	var stripped []string
	if !onOrigin {
		rt = t.network
		first = req.WithContext(req.Context())
		first.Header, stripped = t.strip(req.Header)
	} else if t.cloneFirst {
		first = req.Clone(req.Context())
	}
	if t.decisions != nil {
		d := Decision{To: redactURL(req.URL), Action: ActionSend, Credentials: onOrigin, StrippedHeaders: stripped, Reason: "pinned origin"}
		if !onOrigin {
			d.Reason = "not the pinned origin " + t.origin + ": sent without credentials"
		}
		t.decisions(d)
	}
	resp, err := rt.RoundTrip(first)
	if err != nil || !isRedirect(resp.StatusCode) {
		return resp, err
	}
	return t.follow(req, resp, !onOrigin)
}

func isRedirect(status int) bool {
	switch status {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

// follow walks the redirect chain that resp starts. tainted is true once the
// chain has been off the pinned origin: from then on no hop carries
// credentials, even one that comes back.
func (t *transport) follow(req *http.Request, resp *http.Response, tainted bool) (*http.Response, error) {
	var (
		ctx         = req.Context()
		method      = cmp.Or(req.Method, http.MethodGet)
		bodyDropped = false
		prev        = req.URL
		visited     = map[string]bool{requestKey(method, prev): true}
	)
	for hop := 1; ; hop++ {
		loc := resp.Header.Get("Location")
		if loc == "" {
			// A 3xx without Location is the server's answer, not a redirect.
			return resp, nil
		}
		status := resp.StatusCode
		next, err := prev.Parse(loc)
		refuse := func(rule error) (*http.Response, error) {
			discard(resp)
			e := &RedirectError{Hop: hop, Status: status, From: redactURL(prev), Err: rule}
			if next != nil {
				e.To = redactURL(next)
			}
			t.report(Decision{Hop: hop, From: e.From, To: e.To, Status: status, Action: ActionRefuse, Reason: e.Error()})
			return nil, e
		}
		if err != nil {
			return refuse(ErrBadLocation)
		}
		next.Fragment, next.RawFragment = "", ""
		if hop > t.maxRedirects {
			return refuse(ErrTooManyRedirects)
		}
		if strings.EqualFold(prev.Scheme, "https") && strings.EqualFold(next.Scheme, "http") {
			return refuse(ErrDowngrade)
		}
		if err := CheckRemoteURL(next); err != nil {
			return refuse(err)
		}

		withBody := !bodyDropped
		switch status {
		case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther:
			// As browsers and net/http do: the follow-up is a GET without
			// the body, except that HEAD stays HEAD.
			if method != http.MethodHead {
				method = http.MethodGet
			}
			withBody, bodyDropped = false, true
		}
		if withBody && hasBody(req) && req.GetBody == nil {
			return refuse(ErrBodyNotReplayable)
		}
		key := requestKey(method, next)
		if visited[key] {
			return refuse(ErrRedirectLoop)
		}
		visited[key] = true

		d := Decision{Hop: hop, From: redactURL(prev), To: redactURL(next), Status: status, Action: ActionFollow}
		tainted = t.credentials(&d, next, tainted)
		header := req.Header.Clone()
		if header == nil {
			header = make(http.Header)
		}
		if tainted {
			header, d.StrippedHeaders = t.strip(header)
		}
		nr, err := hopRequest(ctx, req, method, next, header, withBody)
		if err != nil {
			return refuse(err)
		}

		discard(resp)
		t.report(d)
		rt := t.credentialed
		if tainted {
			rt = t.network
		}
		if resp, err = rt.RoundTrip(nr); err != nil {
			return nil, err
		}
		if !isRedirect(resp.StatusCode) {
			return resp, nil
		}
		prev = next
	}
}

// credentials decides whether the hop to next carries credentials, and
// says why in d. It returns tainted for the rest of the chain: once off the
// pinned origin, no later hop carries them, even one that comes back.
func (t *transport) credentials(d *Decision, next *url.URL, tainted bool) bool {
	switch {
	case !tainted && t.onOrigin(next):
		d.Reason, d.Credentials = "same origin: credentials kept", true
	case !tainted:
		tainted = true
		d.Reason = "left the pinned origin " + t.origin + ": credentials dropped for the rest of the chain"
	case t.onOrigin(next):
		d.Reason = "back on the pinned origin, but credentials were dropped earlier in the chain and stay dropped"
	default:
		d.Reason = "off the pinned origin: no credentials"
	}
	return tainted
}

// hopRequest is the request of a hop to next with header, and req's body
// again when withBody, else without the headers that describe one.
func hopRequest(ctx context.Context, req *http.Request, method string, next *url.URL, header http.Header, withBody bool) (*http.Request, error) {
	nr := &http.Request{
		Method:     method,
		URL:        next,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     header,
	}
	if withBody && hasBody(req) {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("%w: GetBody: %v", ErrBodyNotReplayable, err)
		}
		nr.Body, nr.GetBody, nr.ContentLength = body, req.GetBody, req.ContentLength
	} else {
		for _, h := range bodyHeaders {
			nr.Header.Del(h)
		}
	}
	return nr.WithContext(ctx), nil
}

// bodyHeaders describe a body; they go when a redirect drops it.
var bodyHeaders = []string{"Content-Type", "Content-Length", "Content-Encoding", "Content-Language", "Content-Location"}

// strip returns a copy of h without the sensitive headers, and the canonical
// names it removed, sorted.
func (t *transport) strip(h http.Header) (http.Header, []string) {
	out := make(http.Header, len(h))
	var removed []string
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		if t.sensitive[ck] {
			if !slices.Contains(removed, ck) {
				removed = append(removed, ck)
			}
			continue
		}
		out[k] = v
	}
	slices.Sort(removed)
	return out, removed
}

func (t *transport) onOrigin(u *url.URL) bool {
	return Origin(u) == t.origin
}

func (t *transport) report(d Decision) {
	if t.decisions != nil {
		t.decisions(d)
	}
}

func hasBody(req *http.Request) bool {
	return req.Body != nil && req.Body != http.NoBody
}

// requestKey identifies a hop for loop detection.
func requestKey(method string, u *url.URL) string {
	return method + " " + Origin(u) + u.EscapedPath() + "?" + u.RawQuery
}

// discard closes a redirect response, reading a little of it first so the
// connection can be reused.
func discard(resp *http.Response) {
	const maxDrain = 2 << 10
	io.CopyN(io.Discard, resp.Body, maxDrain)
	resp.Body.Close()
}

// originGate is the transport handed to a credential layer: it refuses any
// request off the pinned origin, in case the layer sends one of its own.
type originGate struct {
	origin string
	next   http.RoundTripper
}

func (g *originGate) RoundTrip(req *http.Request) (*http.Response, error) {
	if Origin(req.URL) != g.origin {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("pinnedfetch: %w (%s, pinned to %s); the layer given to WithCredentials must only call the transport it wraps for the request it was given",
			errOffOriginInjection, redactURL(req.URL), g.origin)
	}
	return g.next.RoundTrip(req)
}
