package edge

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/internal/replay"
	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The hop between replicas: a request one replica's edge allowed, sent to
// the replica that holds its session (the aggregated route's 2025-11-25
// sessions live in one replica's memory). It carries the request's method,
// request URI, body and [HopForwardedHeaders], whom the sender's edge
// authenticated and with what scopes, the access token of a JWT principal
// (never an opaque token), and the client's address as the sender's edge
// saw it (for the receiver's audit lines), the approval or round that let
// an approved 2026-07-28 call run, when it did (HopSettledHeader, which
// the receiver checks in storage), under an HMAC-SHA256, with a
// key derived from the cluster key, over all of them, the session id, the
// sending and the receiving node, the route, a time and a random nonce,
// each field length-prefixed. [HopKey.Verify] takes a hop only if the MAC
// holds, it names the receiving node, its time is within [HopFreshness]
// of the receiver's clock and its nonce is new; a client without the
// cluster key can make none.
//
// The hop carries identity, never authority. Whoever holds the cluster
// key (read from a file an agent could reach, say) can sign any hop, so
// the receiver takes from it only who the request acts for: it looks a
// token up in its own store, verifies a JWT itself, and uses the scopes it
// finds there, narrowed to those the hop claims; a claim of more is
// refused ([HopClaims.Principal]).

// Hop headers.
const (
	HopHeader          = "Zidane-Hop"
	HopPrincipalHeader = "Zidane-Hop-Principal"
	// HopCredentialHeader carries a JWT principal's access token, for the
	// receiver to verify (see [HopKey.Sign]).
	HopCredentialHeader = "Zidane-Hop-Credential"
	HopRefusedHeader    = "Zidane-Hop-Refused" // on the owner's refusal of a hop, for the sender
	HopAnswerHeader     = "Zidane-Hop-Answer"  // on the owner's answer to a hop it took (see [HopKey.AnswerTag])
)

// Bounds of the hop (and of its replay check: see hopreplay.go).
const (
	HopFreshness     = 10 * time.Second // older or newer hops are refused
	maxHopPrincipal  = 16 << 10         // the principal header, encoded
	maxHopCredential = 32 << 10         // a JWT, as large as the verifier takes
)

// HopForwardedHeaders are the only request headers a hop carries, with
// every Mcp-Param-* header ([HopParamHeaders]): what the aggregated route
// and the edge read. The client's Authorization, cookies, Origin,
// Host-derived headers and X-Forwarded-* never leave the edge. DPoP is
// set by the sender from the request's context, for a bound principal
// only: the client's proof, for this same resource, which the receiver
// checks again ([DPoP.CheckForwarded]).
var HopForwardedHeaders = []string{"Accept", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID", "Mcp-Method", "Mcp-Name", "DPoP"}

// HopParamHeaders are h's Mcp-Param-* headers (MCP 2026-07-28), by
// canonical name, sorted: a hop carries them, under its MAC.
func HopParamHeaders(h http.Header) []string {
	var names []string
	for name := range h {
		if len(name) > len(paramHeaderPrefix) && strings.EqualFold(name[:len(paramHeaderPrefix)], paramHeaderPrefix) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// HopKey signs and checks hops with a key derived from the cluster key.
type HopKey struct {
	key    []byte
	replay *replay.Check
}

// NewHopKey returns a HopKey for key (derived from the cluster key for
// the hop; every replica has the same).
func NewHopKey(key []byte) *HopKey {
	return &HopKey{key: key, replay: replay.New(MaxHopNonces, HopFreshness)}
}

// HopClaims is what a checked hop says.
type HopClaims struct {
	From, To string // the sending and the receiving node
	At       int64  // Unix milliseconds
	Nonce    string // 128 random bits, hex
	// TokenID is whom the sender's edge authenticated: a token of the
	// store, or "jwt:<sub>".
	TokenID string
	// Scopes are the scopes the sender's edge found: an upper bound, no
	// grant ([HopClaims.Principal]).
	Scopes []string
	// JWT is a JWT principal's access token, which the receiver verifies;
	// "" for a token of the store.
	JWT string
	// Client is the client's address as the sender's edge saw it ("" when
	// it had none that parses): for the receiver's audit lines only.
	Client string
}

// hopPrincipal is the principal header's document: an identity and the
// scopes the sender claims for it, nothing the receiver would trust.
type hopPrincipal struct {
	ID     string   `json:"id"`
	Scopes []string `json:"scopes"`
}

// Principal is whom the checked hop c acts for on this replica, as a
// authenticates it here ([policy.Authenticator.Forwarded]): the token of
// c.TokenID in this replica's store, or the JWT c carries, verified here,
// with their scopes narrowed to c.Scopes. A token unknown, revoked or
// expired here, a JWT that does not verify or names another subject, is
// refused 401 hop_principal; a claim of scopes the credential lacks, which
// no replica of this cluster makes, 403 hop_scopes.
func (c HopClaims) Principal(ctx context.Context, a policy.Authenticator, now time.Time) (policy.Principal, Verdict) {
	p, err := a.Forwarded(ctx, c.TokenID, c.Scopes, c.JWT, now)
	switch {
	case err == nil:
		return p, Verdict{}
	case errors.Is(err, policy.ErrScopesClaimed):
		return policy.Principal{}, Refuse(http.StatusForbidden, "hop_scopes", err.Error()+"; no replica of this cluster claims more than a credential grants, so another holder of the cluster key signed this hop")
	case errors.Is(err, policy.ErrKeysUnavailable):
		v := Refuse(http.StatusServiceUnavailable, "jwt_keys_unavailable", "the identity provider's signing keys are unavailable to the replica that holds this session right now; retry later")
		v.RetryAfter = 30 * time.Second
		return policy.Principal{}, v
	}
	return policy.Principal{}, hopRefused("hop_principal", strings.TrimPrefix(err.Error(), policy.ErrTokenInvalid.Error()+": "))
}

// mac is the hop's MAC: every field length-prefixed, so that no two hops
// share an input.
func (k *HopKey) mac(method, uri, route, sid, from, to, at, nonce, principal, credential, client string, body []byte, h http.Header) []byte {
	m := hmac.New(sha256.New, k.key)
	var n [binary.MaxVarintLen64]byte
	field := func(s string) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		m.Write([]byte(s))
	}
	field("zidane aggregate hop v3")
	for _, s := range []string{method, uri, route, sid, from, to, at, nonce, principal, credential, client} {
		field(s)
	}
	digest := sha256.Sum256(body)
	field(string(digest[:]))
	for _, name := range HopForwardedHeaders {
		vs := h.Values(name)
		field(strconv.Itoa(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	params := HopParamHeaders(h)
	field(strconv.Itoa(len(params)))
	for _, name := range params {
		vs := h[name]
		field(name)
		field(strconv.Itoa(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	// The settlement of an approved call, on a hop that has one: after
	// every count-prefixed part, so that a hop without it is MACed as
	// before.
	if vs := h.Values(HopSettledHeader); len(vs) > 0 {
		field("settled")
		field(strconv.Itoa(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	return m.Sum(nil)
}

// Sign sets out's hop headers: out goes from node from to node to, on
// route, acting for p, which called from the address client, with body;
// out's forwarded headers (its Mcp-Session-Id among them) must be set
// already. A client that is not an IP address is sent as "". It returns
// the hop's nonce, which the answer's tag is bound to
// ([HopKey.CheckAnswer]).
//
// The hop says who p is (its TokenID) and its scopes, nothing more. For a
// JWT principal it carries jwt, the client's access token, which the
// receiver verifies itself: the receiver cannot look a JWT subject up, and
// taking the sender's word for its scopes is what a holder of the cluster
// key would abuse. This is no token passthrough, which the MCP spec
// forbids for tokens sent on to another resource: the hop goes only to
// another replica of this same gateway (the address in the node registry,
// https or loopback), which is the resource the token was issued for and
// verifies it under the same configuration, and it goes under the hop's
// MAC, so that no one without the cluster key can attach it to another
// request. An opaque token never leaves the edge: for a token of the
// store the receiver looks its id up, and Sign refuses a credential for
// one.
func (k *HopKey) Sign(out *http.Request, route, from, to string, p policy.Principal, jwt, client string, body []byte, now time.Time) (nonce string, err error) {
	switch {
	case policy.IsJWTID(p.TokenID) && !policy.LooksLikeJWT(jwt):
		return "", fmt.Errorf("the request acts for JWT subject %q and its access token is not at hand", strings.TrimPrefix(p.TokenID, policy.JWTPrefix))
	case !policy.IsJWTID(p.TokenID) && jwt != "":
		return "", errors.New("a hop carries a credential only for a JWT subject")
	case len(jwt) > maxHopCredential:
		return "", fmt.Errorf("the access token is %d bytes, over the hop's %d", len(jwt), maxHopCredential)
	}
	pj, err := json.Marshal(hopPrincipal{ID: p.TokenID, Scopes: p.Scopes})
	if err != nil {
		return "", err
	}
	principal := base64.RawURLEncoding.EncodeToString(pj)
	if len(principal) > maxHopPrincipal {
		return "", fmt.Errorf("the principal is %d bytes encoded, over the hop's %d", len(principal), maxHopPrincipal)
	}
	nb := make([]byte, 16)
	_, _ = rand.Read(nb)
	nonce = hex.EncodeToString(nb)
	at := strconv.FormatInt(now.UnixMilli(), 10)
	if a, err := netip.ParseAddr(client); err == nil {
		client = a.String()
	} else {
		client = ""
	}
	mac := k.mac(out.Method, out.URL.RequestURI(), route, out.Header.Get("Mcp-Session-Id"), from, to, at, nonce, principal, jwt, client, body, out.Header)
	out.Header.Set(HopHeader, "v3;from="+from+";to="+to+";t="+at+";n="+nonce+";c="+client+";mac="+base64.RawURLEncoding.EncodeToString(mac))
	out.Header.Set(HopPrincipalHeader, principal)
	if jwt != "" {
		out.Header.Set(HopCredentialHeader, jwt)
	}
	return nonce, nil
}

// AnswerTag is what the receiver of a checked hop sets in its answer's
// HopAnswerHeader: proof, for the sender, that the answer comes from the
// route the hop was for (and not from whatever else listens at the
// advertised address), bound to that one hop.
func (k *HopKey) AnswerTag(c HopClaims) string {
	return base64.RawURLEncoding.EncodeToString(k.answerMAC(c.From, c.To, c.Nonce))
}

// CheckAnswer says whether tag is the answer tag of the hop with nonce
// from node from to node to.
func (k *HopKey) CheckAnswer(tag, from, to, nonce string) bool {
	got, err := base64.RawURLEncoding.DecodeString(tag)
	return err == nil && hmac.Equal(got, k.answerMAC(from, to, nonce))
}

func (k *HopKey) answerMAC(from, to, nonce string) []byte {
	m := hmac.New(sha256.New, k.key)
	var n [binary.MaxVarintLen64]byte
	for _, s := range []string{"zidane aggregate hop answer v1", from, to, nonce} {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		m.Write([]byte(s))
	}
	return m.Sum(nil)
}

// hopRefused is the refusal of a hop: 401 with reason, and the message the
// audit line and the sender get.
func hopRefused(reason, msg string) Verdict {
	return Refuse(http.StatusUnauthorized, reason, msg)
}

// verify checks r, a hop with body, as received by node self on route.
func (k *HopKey) Verify(r *http.Request, uri string, body []byte, self, route string, now time.Time) (HopClaims, Verdict) {
	if len(r.Header.Values(HopHeader)) != 1 || len(r.Header.Values(HopPrincipalHeader)) != 1 || len(r.Header.Values(HopCredentialHeader)) > 1 {
		return HopClaims{}, hopRefused("hop_malformed", "a forwarded request carries one Zidane-Hop and one Zidane-Hop-Principal header, and at most one Zidane-Hop-Credential; these are the replicas' own")
	}
	fields := map[string]string{}
	parts := strings.Split(r.Header.Get(HopHeader), ";")
	if len(parts) != 7 || parts[0] != "v3" {
		return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop header is not one a replica of this cluster writes")
	}
	for _, p := range parts[1:] {
		name, v, ok := strings.Cut(p, "=")
		if _, seen := fields[name]; !ok || seen {
			return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop header is not one a replica of this cluster writes")
		}
		fields[name] = v
	}
	from, to, at, nonce, client, macB64 := fields["from"], fields["to"], fields["t"], fields["n"], fields["c"], fields["mac"]
	principal, credential := r.Header.Get(HopPrincipalHeader), r.Header.Get(HopCredentialHeader)
	mac, err := base64.RawURLEncoding.DecodeString(macB64)
	_, hasClient := fields["c"]
	if client != "" {
		if a, err := netip.ParseAddr(client); err != nil || a.String() != client {
			hasClient = false // only Sign's spelling of an address
		}
	}
	var nb [16]byte
	if err != nil || len(mac) != sha256.Size || len(nonce) != 2*len(nb) || from == "" || to == "" || !hasClient || len(principal) > maxHopPrincipal || len(credential) > maxHopCredential {
		return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop header is not one a replica of this cluster writes")
	}
	want := k.mac(r.Method, uri, route, r.Header.Get("Mcp-Session-Id"), from, to, at, nonce, principal, credential, client, body, r.Header)
	if !hmac.Equal(mac, want) {
		return HopClaims{}, hopRefused("hop_forged", "the forwarded request's signature does not hold: it was altered, meant for another route, or signed with another cluster key")
	}
	if to != self {
		return HopClaims{}, hopRefused("hop_misdirected", fmt.Sprintf("the forwarded request is meant for node %q, not this one", to))
	}
	ms, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop time is not a number")
	}
	if t := time.UnixMilli(ms); t.Before(now.Add(-HopFreshness)) || t.After(now.Add(HopFreshness)) {
		return HopClaims{}, hopRefused("hop_stale", fmt.Sprintf("the forwarded request is dated %v from this node's clock, over the %v allowed: a replay, or clocks that differ (run NTP on every replica)", t.Sub(now).Round(time.Millisecond), HopFreshness))
	}
	var p hopPrincipal
	pj, err := base64.RawURLEncoding.DecodeString(principal)
	if err != nil || json.Unmarshal(pj, &p) != nil || p.ID == "" {
		return HopClaims{}, hopRefused("hop_malformed", "the forwarded request's principal does not decode")
	}
	if _, err := hex.Decode(nb[:], []byte(nonce)); err != nil {
		return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop nonce is not hexadecimal")
	}
	if v := k.checkNonce(from, nb, ms, now); !v.Allowed() {
		return HopClaims{}, v
	}
	return HopClaims{From: from, To: to, At: ms, Nonce: nonce, TokenID: p.ID, Scopes: p.Scopes, JWT: credential, Client: client}, Verdict{}
}

// IsHop says whether a request carries the replicas' hop headers: it is
// then checked by its signature, which no client can make, and nothing
// else.
func IsHop(h http.Header) bool {
	return h[HopHeader] != nil || h[HopPrincipalHeader] != nil || h[HopCredentialHeader] != nil
}
