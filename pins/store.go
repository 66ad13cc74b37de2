package pins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// record is what a namespace holds of one tool: the definition pinned,
// and the changed one seen since, if any.
type record struct {
	Pinned   Definition `json:"pinned"`
	PinnedAt time.Time  `json:"pinned_at"`
	// Approved is set when an operator approved the pinned definition (a
	// change), unset when it was pinned on first sight.
	Approved bool     `json:"approved,omitempty"`
	Pending  *pending `json:"pending,omitempty"`
}

// pending is a changed definition waiting for an operator.
type pending struct {
	Definition
	Seen     time.Time `json:"seen"`
	Rejected bool      `json:"rejected,omitempty"`
}

// document is a namespace's stored pins.
type document struct {
	Namespace string             `json:"namespace"`
	Tools     map[string]*record `json:"tools"`
	// bytes counts the definitions held, against maxHeld.
	bytes int
}

// maxHeld bounds the definitions one namespace holds, pinned and pending,
// in memory and so in storage (where JSON's escapes may double them).
const maxHeld = maxDocument / 2

func (d Definition) size() int {
	n := len(d.Digest)
	for f, v := range d.Fields {
		n += len(f) + len(v)
	}
	return n
}

func (r *record) size() int {
	n := r.Pinned.size()
	if r.Pending != nil {
		n += r.Pending.size()
	}
	return n
}

// recount sets d.bytes from what d holds.
func (d *document) recount() {
	d.bytes = 0
	for _, r := range d.Tools {
		d.bytes += r.size()
	}
}

// Event is one change to a namespace's pins, reported once, by the
// process whose write made it.
type Event struct {
	// Kind is pinned (a tool seen for the first time), changed (a listing
	// differs from the pin), reverted (a listing is the pinned definition
	// again, so the change is void), approved or rejected.
	Kind      string
	Namespace string
	Tool      string
	// Old and New are the digests: the pin's and the listing's (for
	// pinned, New alone).
	Old, New string
	// Diff is the fields that differ, for changed and approved.
	Diff []FieldDiff
}

type opKind uint8

const (
	opSeen opKind = iota + 1
	opApprove
	opReject
)

// op is one change to a document: a listing seen, or an operator's word.
type op struct {
	kind   opKind
	tool   string
	def    Definition // opSeen
	digest string     // opApprove, opReject: the pending digest decided on
	at     time.Time
}

// errNothingPending is apply's answer to an approval or rejection of a
// change that is not the one pending.
var errNothingPending = errors.New("no such change is pending")

// apply applies o to d, and returns the event it makes (nil when it
// changes nothing).
func (d *document) apply(o op) (*Event, error) {
	if d.Tools == nil {
		d.Tools = map[string]*record{}
	}
	rec := d.Tools[o.tool]
	ev := &Event{Namespace: d.Namespace, Tool: o.tool}
	if rec != nil {
		d.bytes -= rec.size()
		defer func() { d.bytes += d.Tools[o.tool].size() }()
	}
	switch o.kind {
	case opSeen:
		switch {
		case rec == nil:
			if len(d.Tools) >= MaxTools || d.bytes+o.def.size() > maxHeld {
				return nil, nil
			}
			d.Tools[o.tool] = &record{Pinned: o.def, PinnedAt: o.at}
			d.bytes += o.def.size()
			ev.Kind, ev.New = "pinned", o.def.Digest
		case rec.Pinned.Digest == o.def.Digest:
			if rec.Pending == nil {
				return nil, nil
			}
			ev.Kind, ev.Old, ev.New = "reverted", rec.Pending.Digest, o.def.Digest
			rec.Pending = nil
		case rec.Pending != nil && rec.Pending.Digest == o.def.Digest:
			return nil, nil
		case d.bytes+rec.Pinned.size()+o.def.size() > maxHeld:
			// No room to hold the change: the pin stays, and the tool
			// differs from it, so strict mode withholds it.
			return nil, nil
		default:
			rec.Pending = &pending{Definition: o.def, Seen: o.at}
			ev.Kind, ev.Old, ev.New, ev.Diff = "changed", rec.Pinned.Digest, o.def.Digest, Diff(rec.Pinned, o.def)
		}
	case opApprove, opReject:
		if rec == nil || rec.Pending == nil || rec.Pending.Digest != o.digest {
			return nil, errNothingPending
		}
		ev.Old, ev.New = rec.Pinned.Digest, rec.Pending.Digest
		if o.kind == opReject {
			ev.Kind = "rejected"
			rec.Pending.Rejected = true
			break
		}
		ev.Kind, ev.Diff = "approved", Diff(rec.Pinned, rec.Pending.Definition)
		d.Tools[o.tool] = &record{Pinned: rec.Pending.Definition, PinnedAt: o.at, Approved: true}
	}
	return ev, nil
}

// space is one namespace in memory.
type space struct {
	mode   Mode
	loaded bool
	doc    *document
	queue  []op // applied in memory, not yet stored
	// unrecorded holds, by tool, why its last listing (an answer to a
	// tools/list) could not be pinned or its change recorded: too large,
	// past the bounds. Strict mode refuses its calls until a listing
	// matches its pin again; each new reason is one event.
	unrecorded map[string]string
	uses       int
	// storing serializes the writes of this namespace (store, decide):
	// each takes the queue's head and drops it once written.
	storing sync.Mutex
}

// Store keeps the pins of every namespace this process decides on. Its
// decisions (Listed, Blocked) never wait for storage: what they change is
// written by a background loop, one storage.Update per namespace at a
// time. Run that loop with Run.
type Store struct {
	st      storage.Storage
	log     *slog.Logger
	onEvent func(Event)
	now     func() time.Time

	mu     sync.Mutex
	spaces map[string]*space
	kick   chan struct{}
}

// NewStore returns a store on st. onEvent (which may be nil) is told of
// every change this process writes.
func NewStore(st storage.Storage, log *slog.Logger, onEvent func(Event)) *Store {
	if onEvent == nil {
		onEvent = func(Event) {}
	}
	return &Store{st: st, log: log, onEvent: onEvent, now: time.Now, spaces: map[string]*space{}, kick: make(chan struct{}, 1)}
}

// Key is where namespace ns is stored.
func Key(ns string) string {
	sum := sha256.Sum256([]byte(ns))
	return "zidane/tool-pins/" + hex.EncodeToString(sum[:16])
}

// Open makes ns known with mode, loading its pins; call Close(ns) when the
// route that opened it goes. A namespace that could not be loaded decides
// as its mode says for unreadable pins (see Listed) until Run loads it.
func (s *Store) Open(ctx context.Context, ns string, mode Mode) error {
	if !validName(ns) {
		return fmt.Errorf("pins: namespace %q is empty, too long or has control characters", ns)
	}
	s.mu.Lock()
	sp := s.spaces[ns]
	if sp == nil {
		sp = &space{doc: &document{Namespace: ns}}
		s.spaces[ns] = sp
	}
	sp.mode = mode
	sp.uses++
	loaded := sp.loaded
	s.mu.Unlock()
	if loaded || mode == Off {
		return nil
	}
	return s.load(ctx, ns)
}

// Close releases one Open of ns.
func (s *Store) Close(ns string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp := s.spaces[ns]; sp != nil {
		sp.uses--
	}
}

// Reload reads ns from storage again (another process changed it), and
// applies on top what this one has not stored yet.
func (s *Store) Reload(ctx context.Context, ns string) error { return s.load(ctx, ns) }

func (s *Store) load(ctx context.Context, ns string) error {
	data, err := s.st.Load(ctx, Key(ns))
	var doc document
	switch {
	case storage.IsNotExist(err):
	case err != nil:
		return fmt.Errorf("pins of %s: %w", ns, err)
	default:
		if err := json.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("pins of %s: the stored pins do not read: %w", ns, err)
		}
		if doc.Namespace != ns {
			return fmt.Errorf("pins of %s: the stored pins are %q's", ns, doc.Namespace)
		}
	}
	doc.Namespace = ns
	doc.recount()
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil {
		return nil
	}
	for _, o := range sp.queue {
		_, _ = doc.apply(o)
	}
	sp.doc, sp.loaded = &doc, true
	return nil
}

// Verdicts of Listed.
const (
	// Shown: the listing is the pinned definition (or the tool was just
	// pinned, or the mode lets changes through).
	Shown = iota
	// Withheld: the tool changed and is withheld until approved.
	Withheld
	// Unpinnable: the tool could not be pinned (too large, past MaxTools,
	// pins unreadable) and strict mode withholds it.
	Unpinnable
)

// Listed decides a listed tool of ns: its upstream name and its listed
// object. It records a tool seen for the first time, and a change.
func (s *Store) Listed(ns, tool string, obj map[string]json.RawMessage) (verdict int, why string) {
	return s.decideListed(ns, tool, obj, true)
}

// Seen decides a tool in a listing the gateway did not ask for (an answer
// that has a listing's shape, to another request: one a client could have
// an upstream's tool echo) as Listed does, but records nothing: such a
// definition neither pins a tool nor counts as a change. A tool that has
// no pin is shown; one whose pin differs is withheld (strict).
func (s *Store) Seen(ns, tool string, obj map[string]json.RawMessage) (verdict int, why string) {
	return s.decideListed(ns, tool, obj, false)
}

func (s *Store) decideListed(ns, tool string, obj map[string]json.RawMessage, record bool) (verdict int, why string) {
	var ev *Event
	verdict, why, ev = s.decideLocked(ns, tool, obj, record)
	if ev != nil {
		s.onEvent(*ev)
	}
	return verdict, why
}

// unrecordedKind is the Event kind of a listing that could not be pinned or
// recorded (see space.unrecorded).
const unrecordedKind = "unrecorded"

// noteUnrecorded records on sp why tool's listing could not be recorded,
// and returns the event to report when the reason is new; "" clears it.
func noteUnrecorded(sp *space, ns, tool, why, old, new string) *Event {
	if sp.unrecorded == nil {
		sp.unrecorded = map[string]string{}
	}
	if sp.unrecorded[tool] == why {
		return nil
	}
	if why == "" {
		delete(sp.unrecorded, tool)
		return nil
	}
	sp.unrecorded[tool] = why
	return &Event{Kind: unrecordedKind, Namespace: ns, Tool: tool, Old: old, New: new}
}

func (s *Store) decideLocked(ns, tool string, obj map[string]json.RawMessage, record bool) (verdict int, why string, ev *Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil || sp.mode == Off {
		return Shown, "", nil
	}
	mode := sp.mode
	refuse := func(v int, why string) (int, string, *Event) {
		if mode == Warn {
			return Shown, why, ev
		}
		return v, why, ev
	}
	def, err := Canonical(tool, obj)
	if err == nil && !validName(tool) {
		err = fmt.Errorf("tool name %q cannot be pinned", tool)
	}
	if err != nil {
		if record && validName(tool) {
			old := ""
			if rec := sp.doc.Tools[tool]; rec != nil {
				old = rec.Pinned.Digest
			}
			ev = noteUnrecorded(sp, ns, tool, err.Error(), old, "")
		}
		return refuse(Unpinnable, err.Error())
	}
	if !sp.loaded {
		return refuse(Unpinnable, "the gateway has not read its tool pins yet")
	}
	if record {
		o := op{kind: opSeen, tool: tool, def: def, at: s.now()}
		if ev, _ := sp.doc.apply(o); ev != nil {
			sp.queue = append(sp.queue, o)
			s.wake()
		}
	}
	rec := sp.doc.Tools[tool]
	switch {
	case rec == nil && !record:
		return Shown, "", nil
	case rec == nil:
		why := fmt.Sprintf("%s pins at most %d tools, or %d bytes of definitions; tool %q is past them and cannot be pinned", ns, MaxTools, maxHeld, tool)
		ev = noteUnrecorded(sp, ns, tool, why, "", def.Digest)
		return refuse(Unpinnable, why)
	case rec.Pinned.Digest != def.Digest:
		if record && (rec.Pending == nil || rec.Pending.Digest != def.Digest) {
			// No room to record the change: the pin stays, and the
			// tool is refused until a listing matches it again.
			ev = noteUnrecorded(sp, ns, tool, fmt.Sprintf("tool %q of %s changed, and the change is past the bytes %s may hold (%d), so it could not be recorded for approval", tool, ns, ns, maxHeld), rec.Pinned.Digest, def.Digest)
		}
		return refuse(Withheld, changedMessage(ns, tool))
	}
	if record {
		noteUnrecorded(sp, ns, tool, "", "", "")
	}
	return Shown, "", nil
}

// Blocked says why a call to tool of ns is refused: it changed since it
// was pinned and the change is not approved (strict mode), or the pins
// cannot be read yet. "" allows it. A tool never listed has no pin and is
// allowed: no definition of it reached a client through the gateway.
func (s *Store) Blocked(ns, tool string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil || sp.mode != Strict {
		return ""
	}
	if !sp.loaded {
		return "the gateway has not read its tool pins yet; call again shortly"
	}
	if rec := sp.doc.Tools[tool]; rec != nil && rec.Pending != nil {
		return changedMessage(ns, tool)
	}
	if why := sp.unrecorded[tool]; why != "" {
		return why + "; the gateway refuses its calls until the upstream lists a definition it can check"
	}
	return ""
}

func changedMessage(ns, tool string) string {
	return fmt.Sprintf("tool %q of %s changed its definition since it was approved, and the gateway withholds it until an operator approves the change: `caddy zidane tools diff %s %s`, then `caddy zidane tools approve %s %s` (or reject)",
		tool, ns, ns, tool, ns, tool)
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run writes what decisions changed, and loads the namespaces that could
// not be read, until ctx ends; then it writes what is left, for at most
// flushFor.
func (s *Store) Run(ctx context.Context, flushFor time.Duration) {
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), flushFor)
			s.flush(fctx)
			cancel()
			return
		case <-s.kick:
		case <-retry.C:
			s.loadMissing(ctx)
		}
		s.flush(ctx)
	}
}

func (s *Store) loadMissing(ctx context.Context) {
	s.mu.Lock()
	var missing []string
	for ns, sp := range s.spaces {
		if !sp.loaded && sp.mode != Off {
			missing = append(missing, ns)
		}
	}
	s.mu.Unlock()
	for _, ns := range missing {
		if err := s.load(ctx, ns); err != nil && ctx.Err() == nil {
			s.log.Warn("reading tool pins", "namespace", ns, "error", err.Error())
		}
	}
}

// flush stores each namespace's queued changes.
func (s *Store) flush(ctx context.Context) {
	s.mu.Lock()
	var names []string
	for ns, sp := range s.spaces {
		if len(sp.queue) > 0 && sp.loaded {
			names = append(names, ns)
		}
	}
	s.mu.Unlock()
	for _, ns := range names {
		if err := s.store(ctx, ns); err != nil && ctx.Err() == nil {
			s.log.Warn("storing tool pins; retrying", "namespace", ns, "error", err.Error())
		}
	}
}

// store writes ns's queued changes with one read-modify-write.
func (s *Store) store(ctx context.Context, ns string) error {
	s.mu.Lock()
	sp := s.spaces[ns]
	s.mu.Unlock()
	if sp == nil {
		return nil
	}
	sp.storing.Lock()
	defer sp.storing.Unlock()
	return s.storeLocked(ctx, ns, sp)
}

// storeLocked is store, with sp.storing held.
func (s *Store) storeLocked(ctx context.Context, ns string, sp *space) error {
	s.mu.Lock()
	ops := sp.queue
	s.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	doc, events, err := s.update(ctx, ns, ops)
	if err != nil {
		return err
	}
	s.mu.Lock()
	sp.queue = sp.queue[len(ops):]
	for _, o := range sp.queue {
		_, _ = doc.apply(o)
	}
	sp.doc = doc
	s.mu.Unlock()
	for _, ev := range events {
		s.onEvent(ev)
	}
	return nil
}

// update applies ops to ns's stored document under its lock, and returns
// the document written and the events of the ops that changed it.
func (s *Store) update(ctx context.Context, ns string, ops []op) (*document, []Event, error) {
	var (
		doc    *document
		events []Event
	)
	err := storage.Update(ctx, s.st, Key(ns), func(old []byte) ([]byte, error) {
		doc, events = &document{Namespace: ns}, nil
		if old != nil {
			if err := json.Unmarshal(old, doc); err != nil {
				return nil, fmt.Errorf("the stored pins do not read (nothing was written): %w", err)
			}
			if doc.Namespace != ns {
				return nil, fmt.Errorf("the stored pins are %q's (nothing was written)", doc.Namespace)
			}
			doc.recount()
		}
		var firstErr error
		for _, o := range ops {
			ev, err := doc.apply(o)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if ev != nil {
				events = append(events, *ev)
			}
		}
		if firstErr != nil && len(ops) == 1 {
			return nil, firstErr
		}
		out, err := json.Marshal(doc)
		if err != nil {
			return nil, err
		}
		if len(out) > maxDocument {
			return nil, fmt.Errorf("the pins would be %d bytes, over %d (nothing was written)", len(out), maxDocument)
		}
		return out, nil
	})
	return doc, events, err
}

// decide writes an operator's approval or rejection of the change of tool
// whose digest is digest, and takes it in at once.
func (s *Store) decide(ctx context.Context, ns, tool, digest string, kind opKind) (Event, error) {
	s.mu.Lock()
	sp := s.spaces[ns]
	s.mu.Unlock()
	if sp == nil {
		return Event{}, fmt.Errorf("no route of this gateway pins %q", ns)
	}
	sp.storing.Lock()
	defer sp.storing.Unlock()
	// What this process queued goes first, so that the change decided on
	// is the one it stored.
	if err := s.storeLocked(ctx, ns, sp); err != nil {
		return Event{}, err
	}
	doc, events, err := s.update(ctx, ns, []op{{kind: kind, tool: tool, digest: digest, at: s.now()}})
	if errors.Is(err, errNothingPending) {
		return Event{}, fmt.Errorf("tool %q of %s has no pending change %s: run `caddy zidane tools list %s` to see what is pending", tool, ns, digest, ns)
	}
	if err != nil {
		return Event{}, err
	}
	s.mu.Lock()
	for _, o := range sp.queue {
		_, _ = doc.apply(o)
	}
	sp.doc, sp.loaded = doc, true
	s.mu.Unlock()
	for _, ev := range events {
		s.onEvent(ev)
	}
	return events[0], nil
}

// Approve pins the pending change of tool of ns whose digest is digest
// ("" for whichever is pending).
func (s *Store) Approve(ctx context.Context, ns, tool, digest string) (Event, error) {
	return s.decide(ctx, ns, tool, s.pendingDigest(ns, tool, digest), opApprove)
}

// Reject marks the pending change of tool rejected: the tool stays
// withheld (strict mode) while the upstream lists that definition, with
// no new audit line for it.
func (s *Store) Reject(ctx context.Context, ns, tool, digest string) (Event, error) {
	return s.decide(ctx, ns, tool, s.pendingDigest(ns, tool, digest), opReject)
}

func (s *Store) pendingDigest(ns, tool, digest string) string {
	if digest != "" {
		return digest
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp := s.spaces[ns]; sp != nil {
		if rec := sp.doc.Tools[tool]; rec != nil && rec.Pending != nil {
			return rec.Pending.Digest
		}
	}
	return "(none)"
}

// ToolState is what List shows of one tool.
type ToolState struct {
	Tool     string    `json:"tool"`
	Digest   string    `json:"digest"`
	PinnedAt time.Time `json:"pinned_at"`
	Approved bool      `json:"approved,omitempty"`
	// Pending is the changed definition waiting for an operator.
	Pending *PendingState `json:"pending,omitempty"`
}

// PendingState is a change waiting for an operator.
type PendingState struct {
	Digest   string    `json:"digest"`
	Seen     time.Time `json:"seen"`
	Rejected bool      `json:"rejected,omitempty"`
	Fields   []string  `json:"changed_fields"`
}

// Namespace is what List shows of a namespace.
type Namespace struct {
	Name   string      `json:"namespace"`
	Mode   string      `json:"mode"`
	Loaded bool        `json:"loaded"`
	Tools  []ToolState `json:"tools"`
}

// List shows the namespaces this process has open, or only ns.
func (s *Store) List(ns string) ([]Namespace, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := sortedNames(s.spaces)
	if ns != "" {
		if s.spaces[ns] == nil {
			return nil, fmt.Errorf("no route of this gateway pins %q", ns)
		}
		names = []string{ns}
	}
	var out []Namespace
	for _, n := range names {
		sp := s.spaces[n]
		if sp.uses <= 0 {
			continue
		}
		view := Namespace{Name: n, Mode: sp.mode.String(), Loaded: sp.loaded, Tools: []ToolState{}}
		for _, t := range sortedNames(sp.doc.Tools) {
			rec := sp.doc.Tools[t]
			ts := ToolState{Tool: t, Digest: rec.Pinned.Digest, PinnedAt: rec.PinnedAt, Approved: rec.Approved}
			if p := rec.Pending; p != nil {
				ts.Pending = &PendingState{Digest: p.Digest, Seen: p.Seen, Rejected: p.Rejected, Fields: ChangedFields(Diff(rec.Pinned, p.Definition))}
			}
			view.Tools = append(view.Tools, ts)
		}
		out = append(out, view)
	}
	return out, nil
}

// ToolDiff is what DiffOf shows of a tool's pending change.
type ToolDiff struct {
	Namespace string      `json:"namespace"`
	Tool      string      `json:"tool"`
	Pinned    string      `json:"pinned"`
	Pending   string      `json:"pending"`
	Rejected  bool        `json:"rejected,omitempty"`
	Fields    []FieldDiff `json:"fields"`
}

// DiffOf shows tool's pending change, field by field.
func (s *Store) DiffOf(ns, tool string) (ToolDiff, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil {
		return ToolDiff{}, fmt.Errorf("no route of this gateway pins %q", ns)
	}
	rec := sp.doc.Tools[tool]
	switch {
	case rec == nil:
		return ToolDiff{}, fmt.Errorf("%s has no pin of tool %q (it has not been listed through the gateway)", ns, tool)
	case rec.Pending == nil:
		return ToolDiff{}, fmt.Errorf("tool %q of %s has no pending change: its listing is the pinned definition %s", tool, ns, rec.Pinned.Digest)
	}
	return ToolDiff{Namespace: ns, Tool: tool, Pinned: rec.Pinned.Digest, Pending: rec.Pending.Digest, Rejected: rec.Pending.Rejected,
		Fields: Diff(rec.Pinned, rec.Pending.Definition)}, nil
}
