package edge

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
)

// The hop between replicas: a request one replica's edge allowed, sent to
// the replica that holds its session (the aggregated route's 2025-11-25
// sessions live in one replica's memory). It carries the request's method,
// request URI, body and [HopForwardedHeaders], the principal the sender's
// edge authenticated (never the client's credential) and the client's
// address as the sender's edge saw it (for the receiver's audit lines),
// under an HMAC-SHA256, with a key derived from the cluster key, over all
// of them, the session id, the sending and the receiving node, the route,
// a time and a random nonce, each field length-prefixed. [HopKey.Verify] takes a
// hop only if the MAC holds, it names the receiving node, its time is
// within [HopFreshness] of the receiver's clock and its nonce is new; a
// client without the cluster key can make none.

// Hop headers.
const (
	HopHeader          = "Zidane-Hop"
	HopPrincipalHeader = "Zidane-Hop-Principal"
	HopRefusedHeader   = "Zidane-Hop-Refused" // on the owner's refusal of a hop, for the sender
	HopAnswerHeader    = "Zidane-Hop-Answer"  // on the owner's answer to a hop it took (see [HopKey.AnswerTag])
)

// Bounds of the hop (and of its replay check: see hopreplay.go).
const (
	HopFreshness    = 10 * time.Second // older or newer hops are refused
	maxHopPrincipal = 16 << 10         // the principal header, encoded
)

// HopForwardedHeaders are the only request headers a hop carries, with
// every Mcp-Param-* header ([HopParamHeaders]): what the aggregated route
// and the edge read. The client's Authorization, cookies, Origin,
// Host-derived headers and X-Forwarded-* never leave the edge.
var HopForwardedHeaders = []string{"Accept", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID", "Mcp-Method", "Mcp-Name"}

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
	replay *replayCheck
}

// NewHopKey returns a HopKey for key (derived from the cluster key for
// the hop; every replica has the same).
func NewHopKey(key []byte) *HopKey { return &HopKey{key: key, replay: newReplayCheck(MaxHopNonces)} }

// HopClaims is what a checked hop says.
type HopClaims struct {
	From, To  string           // the sending and the receiving node
	At        int64            // Unix milliseconds
	Nonce     string           // 128 random bits, hex
	Principal policy.Principal // whom the sender's edge authenticated
	// Client is the client's address as the sender's edge saw it ("" when
	// it had none that parses): for the receiver's audit lines only.
	Client string
}

// mac is the hop's MAC: every field length-prefixed, so that no two hops
// share an input.
func (k *HopKey) mac(method, uri, route, sid, from, to, at, nonce, principal, client string, body []byte, h http.Header) []byte {
	m := hmac.New(sha256.New, k.key)
	var n [binary.MaxVarintLen64]byte
	field := func(s string) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		m.Write([]byte(s))
	}
	field("zidane aggregate hop v2")
	for _, s := range []string{method, uri, route, sid, from, to, at, nonce, principal, client} {
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
	return m.Sum(nil)
}

// Sign sets out's hop headers: out goes from node from to node to, on
// route, acting for p, which called from the address client, with body;
// out's forwarded headers (its Mcp-Session-Id among them) must be set
// already. A client that is not an IP address is sent as "". It returns
// the hop's nonce, which the answer's tag is bound to
// ([HopKey.CheckAnswer]).
func (k *HopKey) Sign(out *http.Request, route, from, to string, p policy.Principal, client string, body []byte, now time.Time) (nonce string, err error) {
	pj, err := json.Marshal(p)
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
	mac := k.mac(out.Method, out.URL.RequestURI(), route, out.Header.Get("Mcp-Session-Id"), from, to, at, nonce, principal, client, body, out.Header)
	out.Header.Set(HopHeader, "v2;from="+from+";to="+to+";t="+at+";n="+nonce+";c="+client+";mac="+base64.RawURLEncoding.EncodeToString(mac))
	out.Header.Set(HopPrincipalHeader, principal)
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
	if len(r.Header.Values(HopHeader)) != 1 || len(r.Header.Values(HopPrincipalHeader)) != 1 {
		return HopClaims{}, hopRefused("hop_malformed", "a forwarded request carries one Zidane-Hop and one Zidane-Hop-Principal header; these are the replicas' own")
	}
	fields := map[string]string{}
	parts := strings.Split(r.Header.Get(HopHeader), ";")
	if len(parts) != 7 || parts[0] != "v2" {
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
	principal := r.Header.Get(HopPrincipalHeader)
	mac, err := base64.RawURLEncoding.DecodeString(macB64)
	_, hasClient := fields["c"]
	if client != "" {
		if a, err := netip.ParseAddr(client); err != nil || a.String() != client {
			hasClient = false // only Sign's spelling of an address
		}
	}
	var nb [16]byte
	if err != nil || len(mac) != sha256.Size || len(nonce) != 2*len(nb) || from == "" || to == "" || !hasClient || len(principal) > maxHopPrincipal {
		return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop header is not one a replica of this cluster writes")
	}
	want := k.mac(r.Method, uri, route, r.Header.Get("Mcp-Session-Id"), from, to, at, nonce, principal, client, body, r.Header)
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
	var p policy.Principal
	pj, err := base64.RawURLEncoding.DecodeString(principal)
	if err != nil || json.Unmarshal(pj, &p) != nil || p.TokenID == "" {
		return HopClaims{}, hopRefused("hop_malformed", "the forwarded request's principal does not decode")
	}
	if _, err := hex.Decode(nb[:], []byte(nonce)); err != nil {
		return HopClaims{}, hopRefused("hop_malformed", "the Zidane-Hop nonce is not hexadecimal")
	}
	if v := k.replay.check(from, nb, ms, now); !v.Allowed() {
		return HopClaims{}, v
	}
	return HopClaims{From: from, To: to, At: ms, Nonce: nonce, Principal: p, Client: client}, Verdict{}
}
