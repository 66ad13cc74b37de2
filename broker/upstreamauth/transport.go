package upstreamauth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Transport returns the credential layer of the upstream's egress: it
// adds `Authorization: Bearer <token>` to each request, or for a DPoP-bound
// token `Authorization: DPoP <token>` with a fresh proof of the gateway's
// key in a DPoP header, and calls next. Give it to the broker
// (PassThroughOptions.Credentials, ConnOptions.Credentials,
// AggregateOptions.Credentials): pinnedfetch calls it only for hops on the
// upstream's origin, and next refuses any other.
//
//   - A token about to expire is refreshed first (single flight).
//   - A 401 asking for a DPoP nonce (RFC 9449 §9) gets one retry with the
//     nonce and a fresh proof, when the body can be replayed; the nonce is
//     kept for the next requests. A second such answer is handed back as
//     it is: it says nothing about the token, which is kept.
//   - A 401 answer gets one refresh (a new token, for the machine grants)
//     and one retry, when the request body can be replayed (GetBody).
//   - A 403 with error="insufficient_scope" is a step-up: the machine
//     grants get a token with the union of the scopes and one retry; for
//     authorization_code the scopes are recorded and the upstream goes to
//     auth-required, since only an operator can grant them. Step-ups in a
//     row are bounded (Config.MaxStepUp), after which the upstream is in
//     the error state.
//   - With no usable token the request is not sent: the error wraps
//     [ErrAuthRequired] in an [*AuthRequiredError] that names the upstream
//     and says to run `caddy zidane login <upstream>`, or is an
//     [*UnavailableError].
func (c *Client) Transport(next http.RoundTripper) http.RoundTripper {
	return &transport{c: c, next: next}
}

type transport struct {
	c    *Client
	next http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c := t.c
	ctx := req.Context()
	tok, err := c.token(ctx, "")
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, err := t.sendFresh(req, tok)
	if err != nil {
		return nil, err
	}
	if rsNonceChallenge(resp) {
		return resp, nil
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		c.noteChallenge(resp)
		if !replayable(req) {
			// The request cannot be sent again: renew for the next one,
			// and hand this answer back.
			c.token(ctx, tok.access)
			return resp, nil
		}
		drain(resp)
		tok2, err := c.token(ctx, tok.access)
		if err != nil {
			return nil, err
		}
		req2, resp, err := t.resend(req, tok2)
		if err != nil {
			return nil, err
		}
		if rsNonceChallenge(resp) {
			return resp, nil
		}
		if resp.StatusCode == http.StatusUnauthorized {
			c.noteChallenge(resp)
			drain(resp)
			return nil, c.rejected(ctx, tok2.access)
		}
		if resp.StatusCode == http.StatusForbidden {
			return t.forbidden(req2, resp, tok2)
		}
		return resp, nil
	case http.StatusForbidden:
		return t.forbidden(req, resp, tok)
	}
	return resp, nil
}

// forbidden handles a 403: a step-up when it says insufficient_scope,
// otherwise the answer as it is.
func (t *transport) forbidden(req *http.Request, resp *http.Response, tok *hotToken) (*http.Response, error) {
	c := t.c
	ch := parseChallenge(resp.Header, c.now())
	if ch == nil || ch.Error != "insufficient_scope" {
		return resp, nil
	}
	c.noteChallengeParsed(ch)
	if !c.interactive() && replayable(req) {
		drain(resp)
		tok2, err := c.stepUpMachine(req.Context(), ch.Scopes, tok.gen)
		if err != nil {
			return nil, err
		}
		_, resp, err = t.resend(req, tok2)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusForbidden {
			return resp, nil
		}
		ch = parseChallenge(resp.Header, c.now())
		if ch == nil || ch.Error != "insufficient_scope" {
			return resp, nil
		}
	}
	drain(resp)
	return nil, c.stepUp(req.Context(), ch.Scopes, tok.gen)
}

// resend sends req again, its body rewound, with tok; it returns the
// request it sent.
func (t *transport) resend(req *http.Request, tok *hotToken) (*http.Request, *http.Response, error) {
	req2, err := rewind(req)
	if err != nil {
		return nil, nil, err
	}
	resp, err := t.sendFresh(req2, tok)
	return req2, resp, err
}

// sendFresh sends req with tok and, when the upstream asks for a DPoP
// nonce it has not been given yet, once more with it (the body rewound).
func (t *transport) sendFresh(req *http.Request, tok *hotToken) (*http.Response, error) {
	resp, used, err := t.send(req, tok)
	if err != nil || tok.dpop == nil || !rsNonceChallenge(resp) || !replayable(req) {
		return resp, err
	}
	if n := t.c.egress.nonces.get(nonceRS, req.URL); n == "" || n == used {
		return resp, nil
	}
	req2, err := rewind(req)
	if err != nil {
		drain(resp)
		return nil, err
	}
	drain(resp)
	resp, _, err = t.send(req2, tok)
	return resp, err
}

// send attaches tok to a copy of req, with a DPoP proof for a bound token,
// and sends it. It returns the DPoP nonce the proof carried, and keeps the
// one the answer gives.
func (t *transport) send(req *http.Request, tok *hotToken) (*http.Response, string, error) {
	r := *req
	r.Header = req.Header.Clone()
	if r.Header == nil {
		r.Header = make(http.Header, 2)
	}
	r.Header["Authorization"] = []string{tok.header}
	var used string
	if tok.dpop != nil {
		c := t.c
		used = c.egress.nonces.get(nonceRS, req.URL)
		proof, err := tok.dpop.proof(cmp.Or(req.Method, http.MethodGet), req.URL, tok.ath, used, c.now())
		if err != nil {
			closeBody(req)
			return nil, "", err
		}
		r.Header["Dpop"] = []string{proof}
	} else {
		// A DPoP header the caller set is not this layer's, and proves
		// nothing with a Bearer token.
		delete(r.Header, "Dpop")
	}
	resp, err := t.next.RoundTrip(&r)
	if err == nil && tok.dpop != nil {
		t.c.egress.nonces.note(nonceRS, req.URL, resp.Header)
	}
	return resp, used, err
}

func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// rewind returns req with a fresh body for a retry.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("replaying the request body for the retry: %v", err)
	}
	r := *req
	r.Body = body
	return &r, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// noteChallenge remembers the challenge of a 401 or 403, for the next
// discovery.
func (c *Client) noteChallenge(resp *http.Response) {
	if ch := parseChallenge(resp.Header, c.now()); ch != nil {
		c.noteChallengeParsed(ch)
	}
}

func (c *Client) noteChallengeParsed(ch *challenge) {
	c.mu.Lock()
	c.lastChal = ch
	c.mu.Unlock()
}

// rejected handles a token the upstream refused right after it was
// renewed.
func (c *Client) rejected(ctx context.Context, access string) error {
	if !c.interactive() {
		return &UnavailableError{Upstream: c.name, Err: errors.New("the upstream refused a freshly obtained token (HTTP 401); check the client's grants at the authorization server")}
	}
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	c.update(ctx, func(rec *record) (*record, error) {
		if rec == nil || rec.AccessToken != access {
			return rec, errNoChange
		}
		rec.clearTokens("the upstream refused the access token (HTTP 401) even after a refresh")
		return rec, nil
	})
	return c.authRequired()
}

// stepUp records the scopes a 403 insufficient_scope asked for. For
// authorization_code the upstream goes to auth-required (the next login
// requests them), unless the step-ups in a row exceed the bound: then it
// is in the error state, since logging in again does not help.
func (c *Client) stepUp(ctx context.Context, scopes []string, gen uint64) error {
	n := c.countStepUp(scopes, gen)
	if n > c.cfg.maxStepUp() {
		msg := fmt.Sprintf("the upstream keeps answering 403 insufficient_scope (scopes %q) after %d step-ups; check the scopes the authorization server grants and the upstream requires", strings.Join(scopes, " "), n-1)
		c.setState(StateError, msg)
		c.logger.Warn("upstream oauth: step-up limit reached", "upstream", c.name, "scopes", strings.Join(scopes, " "))
		return &UnavailableError{Upstream: c.name, Err: errors.New(msg)}
	}
	if !c.interactive() {
		return &UnavailableError{Upstream: c.name, Err: fmt.Errorf("the upstream requires scopes %q that the authorization server does not grant", strings.Join(scopes, " "))}
	}
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	_, err := c.update(ctx, func(rec *record) (*record, error) {
		if rec == nil {
			rec = &record{}
		}
		rec.NeedScopes = union(rec.NeedScopes, scopes)
		return rec, nil
	})
	if err != nil {
		c.logger.Warn("upstream oauth: cannot store the step-up scopes", "upstream", c.name, "error", c.redact(err.Error()))
	}
	c.mu.Lock()
	c.setStateLocked(StateAuthRequired, "the upstream asks for scopes the token lacks: "+strings.Join(scopes, " "))
	c.mu.Unlock()
	c.hot.Store(nil)
	c.logger.Warn("upstream oauth: step-up needed; login required", "upstream", c.name, "scopes", strings.Join(scopes, " "))
	return c.authRequired()
}

// stepUpMachine gets a machine-grant token with the union of the granted
// and the asked-for scopes.
func (c *Client) stepUpMachine(ctx context.Context, scopes []string, gen uint64) (*hotToken, error) {
	n := c.countStepUp(scopes, gen)
	if n > c.cfg.maxStepUp() {
		msg := fmt.Sprintf("the upstream keeps answering 403 insufficient_scope (scopes %q) after %d step-ups; check the scopes the client may request", strings.Join(scopes, " "), n-1)
		c.setState(StateError, msg)
		return nil, &UnavailableError{Upstream: c.name, Err: errors.New(msg)}
	}
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	var failure error
	_, err := c.update(ctx, func(rec *record) (*record, error) {
		if rec == nil {
			rec = &record{}
		}
		rec.NeedScopes = union(rec.NeedScopes, scopes)
		if err := c.fetch(ctx, rec, scopes); err != nil {
			failure = err
			return nil, errNoChange
		}
		return rec, nil
	})
	if err == nil {
		err = failure
	}
	if err != nil {
		return nil, c.unavailable(err, true)
	}
	c.setState(StateReady, "")
	if h := c.hot.Load(); h != nil {
		return h, nil
	}
	return nil, c.authRequired()
}

// stepUpWindow is how long step-ups for the same scopes count as "in a
// row".
const stepUpWindow = time.Hour

// countStepUp counts a 403 insufficient_scope for scopes, answered to the
// token of generation gen, and returns how many came in a row for the same
// scopes (within stepUpWindow of each other). Each token counts once:
// requests refused with the same token are one round. Another set of
// scopes starts a new count.
func (c *Client) countStepUp(scopes []string, gen uint64) int {
	key := slices.Clone(scopes)
	slices.Sort(key)
	k := strings.Join(key, " ")
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stepKey != k || now.Sub(c.stepAt) > stepUpWindow {
		c.stepKey, c.stepUps, c.stepGen = k, 0, 0
	}
	if c.stepUps == 0 || c.stepGen != gen {
		c.stepUps++
		c.stepGen = gen
	}
	c.stepAt = now
	return c.stepUps
}
