package approvals

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// A call that an approval (or a round of one) let run on one replica may
// be served by another: the aggregated route sends the retry of a bridged
// call to the replica that holds the upstream's pending call. The replica
// that got the call settled it; the one that serves it takes nobody's word
// for that (whoever holds the cluster key can sign a hop), but checks it
// here: the sender marks the approval or round it consumed for the node it
// sends the call to (MarkHop), and that node takes the mark once, for the
// same call by the same caller (TakeHop).

// ErrHop refuses a forwarded call whose settlement does not hold here.
var ErrHop = errors.New("the replica that forwarded this call did not settle it for this replica, or it ran already; make the call again")

// settled is what MarkHop and TakeHop read and change of an approval or a
// round.
type settled struct {
	consumed bool // it let its call run
	hop      *string
	taken    *bool
	call     Call // its caller
	digest   string
	expired  bool
}

// MarkHop records that the call approval or round id let run is sent to
// node to be served there. One marked already is refused.
func (s *Store) MarkHop(ctx context.Context, id, node string) error {
	return s.updateSettled(ctx, id, func(st settled) error {
		if !st.consumed || st.expired || node == "" || *st.hop != "" {
			return ErrHop
		}
		*st.hop = node
		return nil
	})
}

// TakeHop takes the mark MarkHop made for node, once: approval or round
// id must have let call c run (its digest, the same owner and credential),
// be marked for node, unexpired, and not taken before.
func (s *Store) TakeHop(ctx context.Context, id, node string, c Call) error {
	return s.updateSettled(ctx, id, func(st settled) error {
		switch {
		case !st.consumed || st.expired || node == "" || *st.hop != node || *st.taken:
			return ErrHop
		case st.call.Owner != c.Owner || st.call.Credential != c.Credential || st.digest != Digest(c):
			return ErrHop
		}
		*st.taken = true
		return nil
	})
}

// updateSettled runs fn on approval or round id under its storage lock,
// and writes what fn changed; an unknown id is ErrHop.
func (s *Store) updateSettled(ctx context.Context, id string, fn func(settled) error) error {
	now := s.opts.Now()
	if validID(idPrefix, id) {
		err := s.update(ctx, id, func(a *Approval) error {
			return fn(settled{consumed: a.State == Consumed, hop: &a.Hop, taken: &a.HopTaken, call: a.call(), digest: a.Digest, expired: !now.Before(a.Expires)})
		})
		if errors.Is(err, ErrUnknown) {
			return ErrHop
		}
		return err
	}
	if !validID(roundPrefix, id) {
		return ErrHop
	}
	return storage.Update(ctx, s.opts.Store, roundKey(id), func(old []byte) ([]byte, error) {
		var r Round
		if old == nil || len(old) > maxRoundRecord || json.Unmarshal(old, &r) != nil || r.ID != id {
			return nil, ErrHop
		}
		c := Call{Owner: r.Owner, Credential: r.Credential}
		if err := fn(settled{consumed: r.Used, hop: &r.Hop, taken: &r.HopTaken, call: c, digest: r.Digest, expired: !now.Before(r.Expires)}); err != nil {
			return nil, err
		}
		return json.Marshal(r)
	})
}
