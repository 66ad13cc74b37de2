// Package approvals holds the calls that an operator's approve rule
// (package policy/rules) makes wait for a person, and the approvals that
// let exactly those calls run once.
//
// An approval (`apv_` and 128 random bits) is kept in the project's
// storage (Caddy's, so NATS KV in a cluster) under KeyPrefix, and any
// replica serves any step. It holds the call as the edge read it: the
// rule's place and message, the site, route, upstream, method, tool,
// prompt or resource URI, the caller (owner and credential id), the
// arguments as read, and a SHA-256 digest over all of them. Its states are
// pending, then approved or denied by a person, then consumed by the one
// call that runs; a pending approval lives PendingLifetime, an approved
// one ApprovedLifetime from its answer. Each change happens under the
// storage lock of the approval, so that of two answers the first wins and
// of two calls (on any replicas) one consumes it.
//
// An approved call that asks its caller for input (MCP 2026-07-28's
// multi-round calls) goes on in rounds (see Round), kept under
// RoundKeyPrefix: each is bound to the approval, the call's digest and the
// caller, lives no longer than the approval, and is consumed once. A call
// an approval or round let run on one replica and sent to another to be
// served is marked for that replica, which takes the mark once (MarkHop,
// TakeHop).
//
// It decides nothing about who may approve beyond two things it owns: an
// answer never comes from the caller (neither their credential nor their
// owner) unless the rule says self, and an answer to an approval no
// longer pending is refused. Whether a principal holds the approve scope
// for the approval's site is the caller's check, passed to Answer and
// List. It holds no secret: the id is a name, not a credential; what the
// retry must bring is the same caller and the same call.
package approvals

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// Where approvals are kept: each under CallKeyPrefix and its id; per
// caller (under the hex SHA-256 of the owner) the ids of their live
// approvals, which bounds them and finds a call's approval again.
const (
	KeyPrefix       = "zidane/approvals/"
	CallKeyPrefix   = KeyPrefix + "calls/"
	CallerKeyPrefix = KeyPrefix + "callers/"
)

const (
	// DefaultPendingLifetime is how long a held call waits for an answer.
	DefaultPendingLifetime = 30 * time.Minute
	// DefaultApprovedLifetime is how long, after its approval, the call
	// may be made again to run.
	DefaultApprovedLifetime = 10 * time.Minute
	// MaxLifetime bounds either.
	MaxLifetime = 24 * time.Hour
	// MaxPendingPerCaller bounds an owner's approvals awaiting an answer:
	// past it a held call is refused, so that a client calling in a loop
	// cannot fill storage or the approvers' list.
	MaxPendingPerCaller = 16
	// maxCall bounds what one approval keeps (the edge's body limit
	// bounds the arguments before this does).
	maxCall = 1 << 20
	// maxIndex bounds a caller's index as read back.
	maxIndex = 64 << 10
	// maxList bounds how many stored approvals a listing or a prune
	// reads.
	maxList = 1000
)

// idPrefix starts every approval id, so that one in a log or a paste says
// what it is.
const idPrefix = "apv_"

// The states of an approval.
type State string

const (
	Pending  State = "pending"
	Approved State = "approved"
	Denied   State = "denied"
	Consumed State = "consumed"
)

// Why a call or an answer is refused. Each message says what to do.
var (
	ErrUnknown     = errors.New("this approval is unknown: it was never issued here, or it expired and was removed; make the call again to ask for a new one")
	ErrExpired     = errors.New("this approval has expired; make the call again to ask for a new one")
	ErrPending     = errors.New("this call awaits a person's approval; make it again once approved")
	ErrDenied      = errors.New("this call was denied by an approver")
	ErrUsed        = errors.New("this approval was used already: an approval runs its call once; make the call again to ask for a new one")
	ErrCaller      = errors.New("this approval was asked for by another caller; it runs only for the credential whose call it holds")
	ErrMismatch    = errors.New("this is not the call that was approved (its arguments, tool, upstream or rule differ); make the approved call exactly, byte for byte, or ask for a new approval")
	ErrSelf        = errors.New("an approver cannot answer their own call (neither with the calling credential nor as its owner), unless the rule says self")
	ErrNotApprover = errors.New("this principal may not approve calls for this site: it needs the approve scope for it")
	ErrAnswered    = errors.New("this approval was answered already: the first answer stands")
	ErrTooMany     = errors.New("this caller has too many calls waiting for approval; wait for an answer or for them to expire")
)

// Call is a call an approve rule holds, as the edge read it.
type Call struct {
	// Rule and Message are the approve rule's place and message.
	Rule, Message string
	// Self is the rule's word that the caller may approve their own call.
	Self bool
	// Site is the resource (the route's URL), Route the route's kind.
	Site, Route, Upstream string
	Method                string
	Tool, Prompt, URI     string
	// Owner and Credential are the caller: its owner id and the id of the
	// credential (token) that called.
	Owner, Credential string
	// Arguments are the arguments' bytes exactly as the edge read them.
	Arguments []byte
}

// Digest is the SHA-256 of c, in hex: every field, each length-prefixed
// so that no two calls encode alike, and the arguments' bytes as read.
//
// It is over the bytes, not a canonical form of the JSON: the bytes are
// what the edge decided on and what the backend receives, and a
// canonical form would be a second reading of them (escapes, number
// spellings, duplicate keys) that could see the same call where the
// backend sees another. The cost is that a retry must send the same
// bytes: a client that reorders or reformats its arguments asks anew.
// SDKs marshal the same arguments to the same bytes.
func Digest(c Call) string {
	h := sha256.New()
	h.Write([]byte("zidane approval v1\x00"))
	self := "0"
	if c.Self {
		self = "1"
	}
	for _, f := range []string{c.Rule, c.Message, self, c.Site, c.Route, c.Upstream, c.Method, c.Tool, c.Prompt, c.URI, c.Owner, c.Credential} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(c.Arguments)))
	h.Write(n[:])
	h.Write(c.Arguments)
	return hex.EncodeToString(h.Sum(nil))
}

// Approval is a held call and its state.
type Approval struct {
	ID     string `json:"id"`
	State  State  `json:"state"`
	Digest string `json:"digest"`

	Rule       string `json:"rule"`
	Message    string `json:"message"`
	Self       bool   `json:"self,omitempty"`
	Site       string `json:"site"`
	Route      string `json:"route"`
	Upstream   string `json:"upstream,omitempty"`
	Method     string `json:"method"`
	Tool       string `json:"tool,omitempty"`
	Prompt     string `json:"prompt,omitempty"`
	URI        string `json:"uri,omitempty"`
	Owner      string `json:"owner"`
	Credential string `json:"credential"`
	// Arguments are what an approver reads before answering.
	Arguments json.RawMessage `json:"arguments,omitempty"`

	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	// AnsweredBy is the approver's owner id, AnsweredWith their
	// credential's id.
	AnsweredBy   string    `json:"answered_by,omitempty"`
	AnsweredWith string    `json:"answered_with,omitempty"`
	Answered     time.Time `json:"answered,omitzero"`
	// Hop is the replica the consumed call was sent to, to be served
	// there, and HopTaken whether that replica took it (see MarkHop).
	Hop      string `json:"hop,omitempty"`
	HopTaken bool   `json:"hop_taken,omitempty"`
}

func (a Approval) call() Call {
	return Call{Rule: a.Rule, Message: a.Message, Self: a.Self, Site: a.Site, Route: a.Route, Upstream: a.Upstream,
		Method: a.Method, Tool: a.Tool, Prompt: a.Prompt, URI: a.URI, Owner: a.Owner, Credential: a.Credential,
		Arguments: a.Arguments}
}

// Answerer is who answers an approval.
type Answerer struct {
	Owner, Credential string
}

// Event is an answer, or a refused answer, for the audit.
type Event struct {
	// Action is "approved", "denied" or "refused"; for an approved
	// call's next round (see Round), "round" or "round_refused".
	Action string
	ID     string
	// Round is the round's id, for a round's event.
	Round string
	Rule  string
	Site  string
	// Caller is the held call's owner; By and With the answerer (a
	// round's: the caller, and the credential that brought it).
	Caller, By, With string
	// Err is a refusal's reason.
	Err error
}

// Options configures [New].
type Options struct {
	Store storage.Storage
	// PendingLifetime and ApprovedLifetime default to
	// DefaultPendingLifetime and DefaultApprovedLifetime.
	PendingLifetime, ApprovedLifetime time.Duration
	// Now is the clock; time.Now by default.
	Now func() time.Time
	// Audit receives every answer and refused answer, and every round
	// consumed or refused.
	Audit func(Event)
}

// Store holds the approvals.
type Store struct {
	opts Options
}

// New returns the approvals kept in opts.Store.
func New(opts Options) (*Store, error) {
	if opts.Store == nil {
		return nil, errors.New("approvals: no storage")
	}
	if opts.PendingLifetime == 0 {
		opts.PendingLifetime = DefaultPendingLifetime
	}
	if opts.ApprovedLifetime == 0 {
		opts.ApprovedLifetime = DefaultApprovedLifetime
	}
	for _, d := range []time.Duration{opts.PendingLifetime, opts.ApprovedLifetime} {
		if d < time.Second || d > MaxLifetime {
			return nil, fmt.Errorf("approvals: a lifetime of %s is outside 1s to %s", d, MaxLifetime)
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Audit == nil {
		opts.Audit = func(Event) {}
	}
	return &Store{opts: opts}, nil
}

// indexEntry is one of a caller's live approvals.
type indexEntry struct {
	ID         string    `json:"id"`
	Digest     string    `json:"digest"`
	Credential string    `json:"credential"`
	Until      time.Time `json:"until"` // the latest it can live: pending and approved lifetimes
}

func callerKey(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return CallerKeyPrefix + hex.EncodeToString(sum[:])
}

func callKey(id string) string { return CallKeyPrefix + id }

// Hold returns the approval of call c: the caller's live approval of the
// same call (pending, approved or denied) when there is one, else a new
// pending one. An approval consumed, or expired, is not found: the call
// made again asks anew. ErrTooMany past MaxPendingPerCaller.
func (s *Store) Hold(ctx context.Context, c Call) (Approval, error) {
	if c.Owner == "" || c.Credential == "" || c.Rule == "" || c.Method == "" {
		return Approval{}, errors.New("approvals: a held call needs its caller, rule and method")
	}
	if size := len(c.Rule) + len(c.Message) + len(c.Site) + len(c.Route) + len(c.Upstream) + len(c.Method) + len(c.Tool) +
		len(c.Prompt) + len(c.URI) + len(c.Owner) + len(c.Credential) + len(c.Arguments); size > maxCall {
		return Approval{}, fmt.Errorf("approvals: a call of %d bytes is too large to hold for approval (at most %d)", size, maxCall)
	}
	if len(c.Arguments) > 0 && !json.Valid(c.Arguments) {
		return Approval{}, errors.New("approvals: the arguments are not JSON")
	}
	s.prune(ctx)
	digest := Digest(c)
	now := s.opts.Now()
	var held Approval
	err := storage.Update(ctx, s.opts.Store, callerKey(c.Owner), func(old []byte) ([]byte, error) {
		var live []indexEntry
		if len(old) > maxIndex || (old != nil && json.Unmarshal(old, &live) != nil) {
			live = nil // unreadable: its approvals expire on their own
		}
		pending := 0
		kept := live[:0]
		for _, e := range live {
			if !now.Before(e.Until) {
				continue
			}
			a, err := s.load(ctx, e.ID)
			if errors.Is(err, ErrUnknown) || (err == nil && (a.State == Consumed || !now.Before(a.Expires))) {
				continue
			}
			kept = append(kept, e)
			if err != nil {
				return nil, err
			}
			if e.Digest == digest && e.Credential == c.Credential && held.ID == "" {
				held = a
			}
			if a.State == Pending {
				pending++
			}
		}
		live = kept
		if held.ID != "" {
			return json.Marshal(live)
		}
		if pending >= MaxPendingPerCaller {
			return nil, fmt.Errorf("%w (%d pending)", ErrTooMany, pending)
		}
		id, err := newID(idPrefix)
		if err != nil {
			return nil, err
		}
		held = Approval{ID: id, State: Pending, Digest: digest, Rule: c.Rule, Message: c.Message, Self: c.Self,
			Site: c.Site, Route: c.Route, Upstream: c.Upstream, Method: c.Method, Tool: c.Tool, Prompt: c.Prompt,
			URI: c.URI, Owner: c.Owner, Credential: c.Credential, Arguments: slices.Clone(c.Arguments),
			Created: now, Expires: now.Add(s.opts.PendingLifetime)}
		b, err := json.Marshal(held)
		if err != nil {
			return nil, err
		}
		if err := s.opts.Store.Store(ctx, callKey(id), b); err != nil {
			return nil, fmt.Errorf("approvals: the held call could not be stored (%v); try again", err)
		}
		return json.Marshal(append(live, indexEntry{ID: id, Digest: digest, Credential: c.Credential,
			Until: now.Add(s.opts.PendingLifetime + s.opts.ApprovedLifetime)}))
	})
	if err != nil {
		return Approval{}, err
	}
	return held, nil
}

// Get returns the approval of id.
func (s *Store) Get(ctx context.Context, id string) (Approval, error) {
	return s.load(ctx, id)
}

// Consume uses the approval of id up for call c, which must be the call
// it holds, by the same caller, approved and unexpired. Of two Consumes
// on any replicas sharing the storage, one succeeds.
func (s *Store) Consume(ctx context.Context, id string, c Call) (Approval, error) {
	var got Approval
	err := s.update(ctx, id, func(a *Approval) error {
		got = *a
		now := s.opts.Now()
		switch {
		case a.State == Consumed:
			return ErrUsed
		case !now.Before(a.Expires):
			return ErrExpired
		case a.Owner != c.Owner || a.Credential != c.Credential:
			return ErrCaller
		case a.Digest != Digest(c) || Digest(a.call()) != a.Digest:
			return ErrMismatch
		case a.State == Pending:
			return ErrPending
		case a.State == Denied:
			return ErrDenied
		case a.State != Approved:
			return ErrUnknown
		}
		a.State = Consumed
		got = *a
		return nil
	})
	return got, err
}

// Answer approves (approve) or denies the pending approval of id as who,
// when may says who may answer it (the approve scope for its site). The
// first answer wins; every answer and refusal is audited.
func (s *Store) Answer(ctx context.Context, id string, who Answerer, approve bool, may func(Approval) bool) (Approval, error) {
	var got Approval
	err := s.update(ctx, id, func(a *Approval) error {
		got = *a
		now := s.opts.Now()
		switch {
		case who.Owner == "" || who.Credential == "":
			return ErrNotApprover
		case !may(*a):
			return ErrNotApprover
		case !a.Self && (who.Owner == a.Owner || who.Credential == a.Credential):
			return ErrSelf
		case a.State != Pending:
			return ErrAnswered
		case !now.Before(a.Expires):
			return ErrExpired
		}
		a.State = Denied
		if approve {
			a.State = Approved
			a.Expires = now.Add(s.opts.ApprovedLifetime)
		}
		a.AnsweredBy, a.AnsweredWith, a.Answered = who.Owner, who.Credential, now
		got = *a
		return nil
	})
	e := Event{ID: id, Rule: got.Rule, Site: got.Site, Caller: got.Owner, By: who.Owner, With: who.Credential}
	switch {
	case err != nil:
		e.Action, e.Err = "refused", err
	case approve:
		e.Action = "approved"
	default:
		e.Action = "denied"
	}
	s.opts.Audit(e)
	return got, err
}

// List returns the pending, unexpired approvals that may says the
// listing principal may answer, oldest first (at most maxList are read).
func (s *Store) List(ctx context.Context, may func(Approval) bool) ([]Approval, error) {
	keys, err := s.opts.Store.List(ctx, strings.TrimSuffix(CallKeyPrefix, "/"), false)
	if err != nil && !storage.IsNotExist(err) {
		return nil, fmt.Errorf("approvals: could not list (%v); try again", err)
	}
	now := s.opts.Now()
	var out []Approval
	for i, k := range keys {
		if i == maxList {
			break
		}
		a, err := s.load(ctx, strings.TrimPrefix(k, CallKeyPrefix))
		if err != nil || a.State != Pending || !now.Before(a.Expires) || !may(a) {
			continue
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Approval) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// update changes the approval of id under its storage lock; when fn
// returns an error nothing is written.
func (s *Store) update(ctx context.Context, id string, fn func(*Approval) error) error {
	if !validID(idPrefix, id) {
		return ErrUnknown
	}
	return storage.Update(ctx, s.opts.Store, callKey(id), func(old []byte) ([]byte, error) {
		if old == nil {
			return nil, ErrUnknown
		}
		a, err := decode(id, old)
		if err != nil {
			return nil, err
		}
		if err := fn(&a); err != nil {
			return nil, err
		}
		return json.Marshal(a)
	})
}

func (s *Store) load(ctx context.Context, id string) (Approval, error) {
	if !validID(idPrefix, id) {
		return Approval{}, ErrUnknown
	}
	raw, err := s.opts.Store.Load(ctx, callKey(id))
	if storage.IsNotExist(err) {
		return Approval{}, ErrUnknown
	}
	if err != nil {
		return Approval{}, fmt.Errorf("approvals: %s could not be read (%v); try again", id, err)
	}
	return decode(id, raw)
}

// decode reads a stored approval; anything unreadable, or stored under
// another id, is unknown.
func decode(id string, raw []byte) (Approval, error) {
	var a Approval
	if len(raw) > 2*maxCall || json.Unmarshal(raw, &a) != nil || a.ID != id || a.Owner == "" || a.Digest == "" {
		return Approval{}, ErrUnknown
	}
	return a, nil
}

// prune deletes approvals past their lifetime (reading at most maxList),
// each under its lock. A denied or consumed one stays until its expiry,
// so that the caller is told what became of it.
func (s *Store) prune(ctx context.Context) {
	s.pruneUnder(ctx, CallKeyPrefix, func(k string) (time.Time, bool) {
		a, err := s.load(ctx, strings.TrimPrefix(k, CallKeyPrefix))
		return a.Expires, err == nil
	})
}

// Prune deletes the approvals and the rounds past their lifetime (at most
// maxList of each read). Holding a call and issuing a round prune too;
// the gateway also prunes on a timer, so that what an expired approval
// kept (the call's arguments, a backend's state in its rounds) goes even
// when nothing new is written.
func (s *Store) Prune(ctx context.Context) {
	s.prune(ctx)
	s.pruneRounds(ctx)
}

// pruneUnder deletes the records under prefix whose expiry, as expires
// reads it (false: leave the record), has passed: reading at most
// maxList, each deleted under its lock.
func (s *Store) pruneUnder(ctx context.Context, prefix string, expires func(key string) (time.Time, bool)) {
	keys, err := s.opts.Store.List(ctx, strings.TrimSuffix(prefix, "/"), false)
	if err != nil {
		return
	}
	now := s.opts.Now()
	for i, k := range keys {
		if i == maxList || ctx.Err() != nil {
			return
		}
		if exp, ok := expires(k); !ok || now.Before(exp) {
			continue
		}
		if s.opts.Store.Lock(ctx, k) == nil {
			_ = s.opts.Store.Delete(ctx, k)
			_ = s.opts.Store.Unlock(context.WithoutCancel(ctx), k)
		}
	}
}

// newID makes a random id (128 bits) with prefix: an approval's (idPrefix)
// or a round's (roundPrefix).
func newID(prefix string) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// validID reports whether id has the shape of an id newID makes with
// prefix, so that no other string names a storage key.
func validID(prefix, id string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) != 22 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	return err == nil && len(b) == 16
}
