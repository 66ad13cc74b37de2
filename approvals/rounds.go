package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// An approved call may ask its caller for input (MCP 2026-07-28's
// multi-round tool calls, SEP-2322): the backend answers input_required
// with a requestState of its own, and the caller makes the same call
// again with that state and its answers. That retry is the approved call
// going on, not a new call, so it needs no new approval; but it must be
// that call, by that caller, once. A Round is the record of one such
// question: the gateway gives the caller a state naming the round in
// place of the backend's, and the retry that brings it consumes the round
// (once, across replicas), which gives back the backend's state.
//
// Rounds are kept in storage beside the approvals, not sealed into the
// state the client carries, for three reasons: a sealed state could be
// replayed, where a stored round is consumed once cluster-wide under its
// lock; any replica serves the next round; and the backend's state, which
// may say what the backend decided so far, never leaves the gateway.
const (
	// RoundKeyPrefix is where rounds are kept, each under its id.
	RoundKeyPrefix = KeyPrefix + "rounds/"
	// MaxStateBytes bounds the backend's requestState that a round keeps:
	// past it the backend's question is refused (ErrStateTooLarge).
	MaxStateBytes = 64 << 10
	// MaxRounds bounds the questions one approved call may ask.
	MaxRounds = 32
)

// roundPrefix starts every round's id.
const roundPrefix = "apr_"

// maxRoundRecord bounds a stored round as read back: its state, JSON
// escaped (six bytes a byte at worst), and the rest.
const maxRoundRecord = 6*MaxStateBytes + 4<<10

// Why a round is refused, besides ErrUsed, ErrExpired, ErrCaller and
// ErrMismatch.
var (
	ErrStateTooLarge = fmt.Errorf("the server's requestState is over %d bytes, more than the gateway keeps for an approved call's next round; ask the operator of the server to keep its state smaller", MaxStateBytes)
	ErrTooManyRounds = fmt.Errorf("this approved call asked for input %d times, as many as an approved call may; make the call again to ask for a new approval", MaxRounds)
)

// Grant is what let an approved call run: the approval consumed, or a
// round of it. It is what the call's next round is bound to.
type Grant struct {
	// Approval is the approval's id.
	Approval string
	// Digest is the approved call's (see Digest).
	Digest            string
	Owner, Credential string
	Tool              string
	// Expires is the approval's: no round of the call outlives it.
	Expires time.Time
	// Rounds is how many questions the call asked so far.
	Rounds int
}

// GrantOf is the grant of approval a, just consumed.
func GrantOf(a Approval) Grant {
	return Grant{Approval: a.ID, Digest: a.Digest, Owner: a.Owner, Credential: a.Credential, Tool: a.Tool, Expires: a.Expires}
}

// Round is one question of an approved call: the backend's requestState
// (State, when HasState), kept for the retry that brings the round's id.
type Round struct {
	ID         string `json:"id"`
	Approval   string `json:"approval"`
	Digest     string `json:"digest"`
	Owner      string `json:"owner"`
	Credential string `json:"credential"`
	Tool       string `json:"tool,omitempty"`
	// N is the round's place: 1 for the call's first question.
	N        int       `json:"n"`
	HasState bool      `json:"has_state,omitempty"`
	State    string    `json:"state,omitempty"`
	Used     bool      `json:"used,omitempty"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
	// Hop is the replica the round's call was sent to, to be served
	// there, and HopTaken whether that replica took it (see MarkHop).
	Hop      string `json:"hop,omitempty"`
	HopTaken bool   `json:"hop_taken,omitempty"`
}

func roundKey(id string) string { return RoundKeyPrefix + id }

// IsRoundID reports whether id has the shape of a round's id.
func IsRoundID(id string) bool { return validID(roundPrefix, id) }

// Grant is the grant of the round: what its call's next round binds to.
func (r Round) Grant() Grant {
	return Grant{Approval: r.Approval, Digest: r.Digest, Owner: r.Owner, Credential: r.Credential, Tool: r.Tool, Expires: r.Expires, Rounds: r.N}
}

// IssueRound keeps the backend's requestState (state, when hasState) of
// the call that g let run, and returns the round that the caller's retry
// names. It lives as long as g's approval.
func (s *Store) IssueRound(ctx context.Context, g Grant, state string, hasState bool) (Round, error) {
	now := s.opts.Now()
	switch {
	case g.Approval == "" || g.Digest == "" || g.Owner == "" || g.Credential == "":
		return Round{}, errors.New("approvals: a round needs its approved call and caller")
	case len(state) > MaxStateBytes:
		return Round{}, ErrStateTooLarge
	case g.Rounds >= MaxRounds:
		return Round{}, ErrTooManyRounds
	case !now.Before(g.Expires):
		return Round{}, ErrExpired
	}
	s.pruneRounds(ctx)
	id, err := newID(roundPrefix)
	if err != nil {
		return Round{}, err
	}
	rec := Round{ID: id, Approval: g.Approval, Digest: g.Digest,
		Owner: g.Owner, Credential: g.Credential, Tool: g.Tool, N: g.Rounds + 1, HasState: hasState, State: state,
		Created: now, Expires: g.Expires}
	raw, err := json.Marshal(rec)
	if err != nil {
		return Round{}, err
	}
	if err := s.opts.Store.Store(ctx, roundKey(rec.ID), raw); err != nil {
		return Round{}, fmt.Errorf("approvals: the round could not be stored (%v); make the call again", err)
	}
	return rec, nil
}

// ConsumeRound uses round id up for call c, which must be the approved
// call, by the same caller (owner and credential), before the approval
// expires. A refused round is returned too, but for ErrCaller, to name
// its approval. Of two ConsumeRounds on any replicas sharing the storage, one
// succeeds. An unknown round, or another caller's, is ErrCaller alike, so
// that the answer tells nothing of others' rounds. Each outcome is
// audited, naming the approval when the round is known.
func (s *Store) ConsumeRound(ctx context.Context, id string, c Call) (Round, error) {
	var got Round
	err := ErrCaller
	if validID(roundPrefix, id) {
		err = storage.Update(ctx, s.opts.Store, roundKey(id), func(old []byte) ([]byte, error) {
			if old == nil || len(old) > maxRoundRecord || json.Unmarshal(old, &got) != nil || got.ID != id {
				got = Round{}
				return nil, ErrCaller
			}
			switch {
			case got.Owner != c.Owner || got.Credential != c.Credential:
				return nil, ErrCaller
			case got.Used:
				return nil, ErrUsed
			case !s.opts.Now().Before(got.Expires):
				return nil, ErrExpired
			case got.Digest != Digest(c):
				return nil, ErrMismatch
			}
			got.Used = true
			return json.Marshal(got)
		})
	}
	e := Event{Action: "round", ID: got.Approval, Round: id, Rule: c.Rule, Site: c.Site, Caller: c.Owner, By: c.Owner, With: c.Credential}
	if err != nil {
		e.Action, e.Err = "round_refused", err
	}
	s.opts.Audit(e)
	return got, err
}

// pruneRounds deletes rounds past their approval's lifetime (reading at
// most maxList), each under its lock.
func (s *Store) pruneRounds(ctx context.Context) {
	s.pruneUnder(ctx, RoundKeyPrefix, func(k string) (time.Time, bool) {
		raw, err := s.opts.Store.Load(ctx, k)
		var r Round
		if err != nil || len(raw) > maxRoundRecord || json.Unmarshal(raw, &r) != nil {
			return time.Time{}, false
		}
		return r.Expires, true
	})
}
