package pins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/yosida95/uritemplate/v3"

	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// record is what a namespace holds of one item: the definition pinned,
// and the changed one seen since, if any. A tool held as new to its set
// (Policy.NewTools) has no pinned definition (an empty Digest) until it is
// approved.
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
	Prompts   map[string]*record `json:"prompts,omitempty"`
	Resources map[string]*record `json:"resources,omitempty"`
	Templates map[string]*record `json:"resource_templates,omitempty"`
	Server    map[string]*record `json:"server,omitempty"`
	// ToolSet is set once a tools listing was recorded whole (its last
	// page seen): from then on a tool first seen is new to the set.
	ToolSet bool `json:"tool_set,omitempty"`
	// Revision counts the writes of the document, so that a process
	// never takes a read older than what it holds (a watch's read that
	// comes after its own newer write, a lagging replica of the storage).
	// 0 is a document written before revisions were kept.
	Revision uint64 `json:"revision,omitempty"`
	// bytes counts the definitions held, against maxHeld.
	bytes int
}

// table is d's records of kind k.
func (d *document) table(k Kind) *map[string]*record {
	switch k {
	case Prompt:
		return &d.Prompts
	case Resource:
		return &d.Resources
	case ResourceTemplate:
		return &d.Templates
	case Server:
		return &d.Server
	}
	return &d.Tools
}

func (d *document) records(k Kind) map[string]*record { return *d.table(k) }

// normalize completes a document as read: one written before tool sets
// were kept, which holds tools, had its set listed.
func (d *document) normalize() {
	if d.Revision == 0 && len(d.Tools) > 0 {
		d.ToolSet = true
	}
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
	if r == nil {
		return 0
	}
	n := r.Pinned.size()
	if r.Pending != nil {
		n += r.Pending.size()
	}
	return n
}

// recount sets d.bytes from what d holds.
func (d *document) recount() {
	d.bytes = 0
	for k := range numKinds {
		for _, r := range d.records(k) {
			d.bytes += r.size()
		}
	}
}

// Event is one change to a namespace's pins, reported once, by the
// process whose write made it.
type Event struct {
	// Kind is pinned (an item seen for the first time), added (a tool new
	// to a pinned set, held for approval), changed (a listing differs
	// from the pin), reverted (a listing is the pinned definition again,
	// so the change is void), upgraded (a tool pinned by an older gateway,
	// whose pin covered fewer members, now pinned whole: see
	// Definition.V), approved or rejected.
	Kind      string
	Namespace string
	// Item is the kind of item, Name its name (the upstream's own).
	Item Kind
	Name string
	// Old and New are the digests: the pin's and the listing's (for
	// pinned and added, New alone).
	Old, New string
	// Diff is the fields that differ, for changed, added, upgraded and
	// approved.
	Diff []FieldDiff
}

type opKind uint8

const (
	opSeen opKind = iota + 1
	opApprove
	opReject
	opToolSet
)

// op is one change to a document: a listing seen, a tools listing ended,
// or an operator's word.
type op struct {
	kind   opKind
	item   Kind
	name   string
	def    Definition // opSeen
	hold   bool       // opSeen: a tool new to a listed set waits for approval
	digest string     // opApprove, opReject: the pending digest decided on
	at     time.Time
}

// errNothingPending is apply's answer to an approval or rejection of a
// change that is not the one pending.
var errNothingPending = errors.New("no such change is pending")

// matches reports whether def is the pinned definition p: the same digest,
// or, for a pin made when fewer members were pinned, the same digest of
// those members.
func matches(p, def Definition) bool {
	return p.Digest == def.Digest || (p.V < currentVersion && p.Digest != "" && p.Digest == def.legacy)
}

// apply applies o to d, and returns the event it makes (nil when there is
// none to report) and whether it changed d.
func (d *document) apply(o op) (*Event, bool, error) {
	if o.kind == opToolSet {
		if d.ToolSet {
			return nil, false, nil
		}
		d.ToolSet = true
		return nil, true, nil
	}
	tbl := d.table(o.item)
	if *tbl == nil {
		*tbl = map[string]*record{}
	}
	rec := (*tbl)[o.name]
	ev := &Event{Namespace: d.Namespace, Item: o.item, Name: o.name}
	if rec != nil {
		d.bytes -= rec.size()
		defer func() { d.bytes += (*tbl)[o.name].size() }()
	}
	switch o.kind {
	case opSeen:
		switch {
		case rec == nil:
			if len(*tbl) >= MaxItems || d.bytes+o.def.size() > maxHeld {
				return nil, false, nil
			}
			if o.hold && d.ToolSet {
				(*tbl)[o.name] = &record{Pending: &pending{Definition: o.def, Seen: o.at}}
				ev.Kind, ev.New, ev.Diff = "added", o.def.Digest, Diff(Definition{}, o.def)
			} else {
				(*tbl)[o.name] = &record{Pinned: o.def, PinnedAt: o.at}
				ev.Kind, ev.New = "pinned", o.def.Digest
			}
			d.bytes += o.def.size()
		case rec.Pinned.V < currentVersion && rec.Pinned.Digest != "" && rec.Pinned.Digest == o.def.legacy:
			// A pin of an older gateway, whose members are the listing's:
			// the members it did not cover were served unchecked until
			// now, so the listing is pinned whole on this first sight
			// (see the README). A change pending then is void.
			old, was := rec.Pinned, rec.Pending
			rec.Pinned, rec.Pending = o.def, nil
			switch {
			case old.Digest != o.def.Digest:
				ev.Kind, ev.Old, ev.New, ev.Diff = "upgraded", old.Digest, o.def.Digest, Diff(old, o.def)
			case was != nil:
				ev.Kind, ev.Old, ev.New = "reverted", was.Digest, o.def.Digest
			default:
				return nil, true, nil // the listing has no other member: nothing to report
			}
		case rec.Pinned.Digest == o.def.Digest:
			if rec.Pending == nil {
				return nil, false, nil
			}
			ev.Kind, ev.Old, ev.New = "reverted", rec.Pending.Digest, o.def.Digest
			rec.Pending = nil
		case rec.Pending != nil && rec.Pending.Digest == o.def.Digest:
			return nil, false, nil
		case rec.Pending != nil && rec.Pending.V < currentVersion && rec.Pending.Digest == o.def.legacy:
			// A change an older gateway recorded, listed again: the same
			// change, now with every member.
			rec.Pending.Definition = o.def
			return nil, true, nil
		case d.bytes+rec.Pinned.size()+o.def.size() > maxHeld:
			// No room to hold the change: the pin stays, and the item
			// differs from it, so strict mode withholds it.
			return nil, false, nil
		case rec.Pinned.Digest == "":
			// A held new tool listed otherwise: still new, as listed now.
			rec.Pending = &pending{Definition: o.def, Seen: o.at}
			ev.Kind, ev.New, ev.Diff = "added", o.def.Digest, Diff(Definition{}, o.def)
		default:
			rec.Pending = &pending{Definition: o.def, Seen: o.at}
			ev.Kind, ev.Old, ev.New, ev.Diff = "changed", rec.Pinned.Digest, o.def.Digest, Diff(rec.Pinned, o.def)
		}
	case opApprove, opReject:
		if rec == nil || rec.Pending == nil || rec.Pending.Digest != o.digest {
			return nil, false, errNothingPending
		}
		ev.Old, ev.New = rec.Pinned.Digest, rec.Pending.Digest
		if o.kind == opReject {
			ev.Kind = "rejected"
			rec.Pending.Rejected = true
			break
		}
		ev.Kind, ev.Diff = "approved", Diff(rec.Pinned, rec.Pending.Definition)
		(*tbl)[o.name] = &record{Pinned: rec.Pending.Definition, PinnedAt: o.at, Approved: true}
	}
	return ev, true, nil
}

// itemKey names an item of a namespace.
type itemKey struct {
	kind Kind
	name string
}

// space is one namespace in memory.
type space struct {
	policy Policy
	loaded bool
	doc    *document
	// sum is the SHA-256 of the stored document last read or written: a
	// poll that reads the same bytes has nothing to decode.
	sum   [sha256.Size]byte
	queue []op // applied in memory, not yet stored
	// unrecorded holds, by item, why its last listing (an answer to a
	// list request) could not be pinned or its change recorded: too
	// large, past the bounds. Strict mode refuses its use until a listing
	// matches its pin again; each new reason is one event.
	unrecorded map[itemKey]string
	// refused holds, by kind and foldName, why the use of an item is
	// refused (a pending change, an unrecorded listing), so that a name
	// an upstream would resolve to that item is refused too. It is made
	// again from doc and unrecorded when stale is set.
	refused map[itemKey]string
	// templates holds, made with refused, the resource templates whose use
	// is refused: a read of a URI one of them matches is a use of it.
	templates []templateRefusal
	stale     bool
	uses      int
	// storing serializes the writes of this namespace (store, decide):
	// each takes the queue's head and drops it once written.
	storing sync.Mutex
}

// setDoc makes doc the namespace's copy, with the ops not stored yet
// applied on top.
func (sp *space) setDoc(doc *document, sum [sha256.Size]byte) {
	for _, o := range sp.queue {
		_, _, _ = doc.apply(o)
	}
	sp.doc, sp.loaded, sp.sum, sp.stale = doc, true, sum, true
}

// newer reports whether doc, read or written, may replace the copy: a
// document of a lower revision is a read older than the copy. One of
// revision 0 was written by a gateway that keeps none, and is taken.
func (sp *space) newer(doc *document, exists bool) bool {
	switch {
	case !sp.loaded:
		return true
	case !exists:
		return sp.doc.Revision == 0
	case doc.Revision == 0:
		return true
	}
	return doc.Revision >= sp.doc.Revision
}

// DefaultPoll is how often Run reads every open namespace again.
const DefaultPoll = time.Second

// Store keeps the pins of every namespace this process decides on. Its
// decisions (Listed, Blocked) never wait for storage: what they change is
// written by a background loop, one storage.Update per namespace at a
// time. Run that loop with Run.
type Store struct {
	st      storage.Storage
	log     *slog.Logger
	onEvent func(Event)
	now     func() time.Time
	poll    time.Duration

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
	return &Store{st: st, log: log, onEvent: onEvent, now: time.Now, poll: DefaultPoll, spaces: map[string]*space{}, kick: make(chan struct{}, 1)}
}

// Key is where namespace ns is stored.
func Key(ns string) string {
	sum := sha256.Sum256([]byte(ns))
	return "zidane/tool-pins/" + hex.EncodeToString(sum[:16])
}

// Open makes ns known with policy p, loading its pins; call Close(ns) when
// the route that opened it goes. A namespace that could not be loaded
// decides as its mode says for unreadable pins (see Listed) until Run
// loads it.
func (s *Store) Open(ctx context.Context, ns string, p Policy) error {
	if !validName(ns) {
		return fmt.Errorf("pins: namespace %q is empty, too long or has control characters", ns)
	}
	s.mu.Lock()
	sp := s.spaces[ns]
	if sp == nil {
		sp = &space{doc: &document{Namespace: ns}}
		s.spaces[ns] = sp
	}
	sp.policy = p
	sp.uses++
	loaded := sp.loaded
	s.mu.Unlock()
	if loaded || p.Mode == Off {
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
	exists := err == nil
	if err != nil && !storage.IsNotExist(err) {
		return fmt.Errorf("pins of %s: %w", ns, err)
	}
	sum := sha256.Sum256(data)
	s.mu.Lock()
	sp := s.spaces[ns]
	same := sp != nil && sp.loaded && sp.sum == sum
	s.mu.Unlock()
	if sp == nil || same {
		return nil
	}
	var doc document
	if exists {
		if err := json.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("pins of %s: the stored pins do not read: %w", ns, err)
		}
		if doc.Namespace != ns {
			return fmt.Errorf("pins of %s: the stored pins are %q's", ns, doc.Namespace)
		}
	}
	doc.Namespace = ns
	doc.normalize()
	doc.recount()
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp = s.spaces[ns]; sp == nil || !sp.newer(&doc, exists) {
		return nil
	}
	sp.setDoc(&doc, sum)
	return nil
}

// Verdicts of Listed.
const (
	// Shown: the listing is the pinned definition (or the item was just
	// pinned, or the mode lets changes through).
	Shown = iota
	// Withheld: the item changed, or is a tool new to its set, and is
	// withheld until approved.
	Withheld
	// Unpinnable: the item could not be pinned (too large, past
	// MaxItems, pins unreadable) and strict mode withholds it.
	Unpinnable
)

// Listed decides a listed item of ns: its kind, its upstream name and its
// listed object. It records an item seen for the first time, and a change.
func (s *Store) Listed(ns string, kind Kind, name string, obj map[string]json.RawMessage) (verdict int, why string) {
	return s.decideListed(ns, kind, name, obj, true)
}

// Seen decides an item in a listing the gateway did not ask for (an answer
// that has a listing's shape, to another request: one a client could have
// an upstream's tool echo) as Listed does, but records nothing: such a
// definition neither pins an item nor counts as a change. An item that has
// no pin is shown, unless it is a tool that would be held as new to its
// set; one whose pin differs is withheld (strict).
func (s *Store) Seen(ns string, kind Kind, name string, obj map[string]json.RawMessage) (verdict int, why string) {
	return s.decideListed(ns, kind, name, obj, false)
}

func (s *Store) decideListed(ns string, kind Kind, name string, obj map[string]json.RawMessage, record bool) (verdict int, why string) {
	var ev *Event
	verdict, why, ev = s.decideLocked(ns, kind, name, obj, record)
	if ev != nil {
		s.onEvent(*ev)
	}
	return verdict, why
}

// unrecordedKind is the Event kind of a listing that could not be pinned or
// recorded (see space.unrecorded).
const unrecordedKind = "unrecorded"

// noteUnrecorded records on sp why an item's listing could not be
// recorded, and returns the event to report when the reason is new; ""
// clears it.
func noteUnrecorded(sp *space, ns string, key itemKey, why, old, new string) *Event {
	if sp.unrecorded == nil {
		sp.unrecorded = map[itemKey]string{}
	}
	if sp.unrecorded[key] == why {
		return nil
	}
	sp.stale = true
	if why == "" {
		delete(sp.unrecorded, key)
		return nil
	}
	sp.unrecorded[key] = why
	return &Event{Kind: unrecordedKind, Namespace: ns, Item: key.kind, Name: key.name, Old: old, New: new}
}

func (s *Store) decideLocked(ns string, kind Kind, name string, obj map[string]json.RawMessage, record bool) (verdict int, why string, ev *Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil || sp.policy.Mode == Off {
		return Shown, "", nil
	}
	mode := sp.policy.Mode
	refuse := func(v int, why string) (int, string, *Event) {
		if mode == Warn {
			return Shown, why, ev
		}
		return v, why, ev
	}
	key := itemKey{kind, name}
	def, err := Canonical(kind, name, obj)
	if err == nil && !validName(name) {
		err = fmt.Errorf("%s name %q cannot be pinned", kind, name)
	}
	if err != nil {
		if record && validName(name) {
			old := ""
			if rec := sp.doc.records(kind)[name]; rec != nil {
				old = rec.Pinned.Digest
			}
			ev = noteUnrecorded(sp, ns, key, err.Error(), old, "")
		}
		return refuse(Unpinnable, err.Error())
	}
	if !sp.loaded {
		return refuse(Unpinnable, "the gateway has not read its pins yet")
	}
	hold := kind == Tool && sp.policy.NewTools == HoldNew
	if record {
		o := op{kind: opSeen, item: kind, name: name, def: def, hold: hold, at: s.now()}
		if _, changed, _ := sp.doc.apply(o); changed {
			sp.queue = append(sp.queue, o)
			sp.stale = true
			s.wake()
		}
	}
	rec := sp.doc.records(kind)[name]
	switch {
	case rec == nil && !record:
		if hold && sp.doc.ToolSet {
			return refuse(Withheld, newMessage(ns, name))
		}
		return Shown, "", nil
	case rec == nil:
		why := fmt.Sprintf("%s pins at most %d items of a kind, or %d bytes of definitions; %s %q is past them and cannot be pinned", ns, MaxItems, maxHeld, kind, name)
		ev = noteUnrecorded(sp, ns, key, why, "", def.Digest)
		return refuse(Unpinnable, why)
	case !matches(rec.Pinned, def):
		if record && (rec.Pending == nil || rec.Pending.Digest != def.Digest) {
			// No room to record the change: the pin stays, and the
			// item is refused until a listing matches it again.
			ev = noteUnrecorded(sp, ns, key, fmt.Sprintf("%s %q of %s changed, and the change is past the bytes %s may hold (%d), so it could not be recorded for approval", kind, name, ns, ns, maxHeld), rec.Pinned.Digest, def.Digest)
		}
		if rec.Pinned.Digest == "" {
			return refuse(Withheld, newMessage(ns, name))
		}
		return refuse(Withheld, changedMessage(ns, kind, name))
	}
	if record {
		noteUnrecorded(sp, ns, key, "", "", "")
	}
	return Shown, "", nil
}

// ToolsListed records that a tools listing of ns was seen whole (an
// answer to tools/list without a nextCursor): a tool first seen from then
// on is new to the namespace's set, and held if its policy says so.
func (s *Store) ToolsListed(ns string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil || sp.policy.Mode == Off || !sp.loaded || sp.doc.ToolSet {
		return
	}
	o := op{kind: opToolSet, at: s.now()}
	if _, changed, _ := sp.doc.apply(o); changed {
		sp.queue = append(sp.queue, o)
		s.wake()
	}
}

// Blocked says why the use of an item of ns (a tools/call, a prompts/get,
// a resources/read) is refused: it changed since it was pinned and the
// change is not approved, or it is a tool held as new to its set (strict
// mode), or the pins cannot be read yet. "" allows it. An item is found by
// its name, and by any name an upstream could resolve to it (see
// foldName); a resource also by the resource templates that match its URI,
// a read of it being a use of the template. An item never listed has no
// pin and is allowed: no definition of it reached a client through the
// gateway.
func (s *Store) Blocked(ns string, kind Kind, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil || sp.policy.Mode != Strict {
		return ""
	}
	if !sp.loaded {
		return "the gateway has not read its pins yet; call again shortly"
	}
	if rec := sp.doc.records(kind)[name]; rec != nil && rec.Pending != nil {
		return blockedMessage(ns, kind, name, rec)
	}
	if why := sp.unrecorded[itemKey{kind, name}]; why != "" {
		return unrecordedMessage(why)
	}
	if sp.stale {
		sp.refused, sp.templates = refusedByFold(ns, sp)
		sp.stale = false
	}
	if kind == Resource {
		// A resource a template serves is read by a URI the template
		// matches, as the server matches it (go-sdk with this package).
		for _, t := range sp.templates {
			if t.match.MatchString(name) {
				return t.why
			}
		}
	}
	if len(sp.refused) == 0 {
		return ""
	}
	return sp.refused[itemKey{kind, foldName(name)}]
}

// templateRefusal is a resource template whose use is refused, and why.
type templateRefusal struct {
	match *regexp.Regexp
	why   string
}

// refusedByFold is space.refused and space.templates, made from what sp
// holds. A template that does not parse as a URI template matches every
// URI: the server may read it otherwise, and only a read of it is
// refused, not the namespace's other items.
func refusedByFold(ns string, sp *space) (map[itemKey]string, []templateRefusal) {
	var (
		out       map[itemKey]string
		templates []templateRefusal
	)
	add := func(k itemKey, why string) {
		if out == nil {
			out = map[itemKey]string{}
		}
		out[itemKey{k.kind, foldName(k.name)}] = why
		if k.kind == ResourceTemplate {
			match := anyURI
			if t, err := uritemplate.New(k.name); err == nil {
				match = t.Regexp()
			}
			templates = append(templates, templateRefusal{match, why})
		}
	}
	for k := range numKinds {
		for name, rec := range sp.doc.records(k) {
			if rec.Pending != nil {
				add(itemKey{k, name}, blockedMessage(ns, k, name, rec))
			}
		}
	}
	for k, why := range sp.unrecorded {
		add(k, unrecordedMessage(why))
	}
	return out, templates
}

// anyURI matches every URI.
var anyURI = regexp.MustCompile("")

func unrecordedMessage(why string) string {
	return why + "; the gateway refuses its use until the upstream lists a definition it can check"
}

func blockedMessage(ns string, kind Kind, name string, rec *record) string {
	if rec.Pinned.Digest == "" {
		return newMessage(ns, name)
	}
	return changedMessage(ns, kind, name)
}

// kindFlag is the CLI's --kind flag for items of kind k.
func kindFlag(k Kind) string {
	if k == Tool {
		return ""
	}
	return " --kind " + k.String()
}

func changedMessage(ns string, kind Kind, name string) string {
	return fmt.Sprintf("%s %q of %s changed its definition since it was approved, and the gateway withholds it until an operator approves the change: `caddy zidane tools diff %s %s%s`, then `caddy zidane tools approve %s %s%s` (or reject)",
		kind, name, ns, ns, name, kindFlag(kind), ns, name, kindFlag(kind))
}

func newMessage(ns, name string) string {
	return fmt.Sprintf("tool %q of %s is new since %s's tools were pinned, and the gateway withholds it until an operator approves it: `caddy zidane tools diff %s %s`, then `caddy zidane tools approve %s %s` (or reject)",
		name, ns, ns, ns, name, ns, name)
}

// Pinned returns the pinned members of an item of ns (nil when it has no
// pin), for a route that serves the pinned definition in place of a
// changed one (the instructions, the serverInfo).
func (s *Store) Pinned(ns string, kind Kind, name string) map[string]json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil || !sp.loaded {
		return nil
	}
	rec := sp.doc.records(kind)[name]
	if rec == nil || rec.Pinned.Digest == "" {
		return nil
	}
	out := make(map[string]json.RawMessage, len(rec.Pinned.Fields))
	for f, v := range rec.Pinned.Fields {
		out[f] = v
	}
	return out
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Run writes what decisions changed, and reads every open namespace again
// each poll interval (DefaultPoll), until ctx ends; then it writes what is
// left, for at most flushFor. The reads load a namespace that could not be
// read, and are the safety net under the watches that call Reload: a
// change another process wrote is in force here within one interval even
// when its watch event was lost.
func (s *Store) Run(ctx context.Context, flushFor time.Duration) {
	poll := time.NewTicker(s.poll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), flushFor)
			s.flush(fctx)
			cancel()
			return
		case <-s.kick:
		case <-poll.C:
			s.refresh(ctx)
		}
		s.flush(ctx)
	}
}

// refresh reads every open namespace again.
func (s *Store) refresh(ctx context.Context) {
	s.mu.Lock()
	type open struct {
		ns     string
		loaded bool
	}
	var names []open
	for ns, sp := range s.spaces {
		if sp.uses > 0 && sp.policy.Mode != Off {
			names = append(names, open{ns, sp.loaded})
		}
	}
	s.mu.Unlock()
	for _, o := range names {
		if err := s.load(ctx, o.ns); err != nil && ctx.Err() == nil && !o.loaded {
			// A loaded namespace keeps deciding on its copy: only one
			// that has none says so, each interval.
			s.log.Warn("reading tool pins", "namespace", o.ns, "error", err.Error())
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
	doc, sum, events, err := s.update(ctx, ns, ops)
	if err != nil {
		return err
	}
	s.mu.Lock()
	sp.queue = sp.queue[len(ops):]
	if sp.newer(doc, true) {
		sp.setDoc(doc, sum)
	}
	s.mu.Unlock()
	for _, ev := range events {
		s.onEvent(ev)
	}
	return nil
}

// update applies ops to ns's stored document under its lock, and returns
// the document written, the SHA-256 of what was written, and the events of
// the ops that changed it.
func (s *Store) update(ctx context.Context, ns string, ops []op) (*document, [sha256.Size]byte, []Event, error) {
	var (
		doc    *document
		sum    [sha256.Size]byte
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
			doc.normalize()
			doc.recount()
		}
		var firstErr error
		for _, o := range ops {
			ev, _, err := doc.apply(o)
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
		doc.Revision++
		out, err := json.Marshal(doc)
		if err != nil {
			return nil, err
		}
		if len(out) > maxDocument {
			return nil, fmt.Errorf("the pins would be %d bytes, over %d (nothing was written)", len(out), maxDocument)
		}
		sum = sha256.Sum256(out)
		return out, nil
	})
	return doc, sum, events, err
}

// decide writes an operator's approval or rejection of the change of an
// item whose digest is digest, and takes it in at once.
func (s *Store) decide(ctx context.Context, ns string, kind Kind, name, digest string, o opKind) (Event, error) {
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
	doc, sum, events, err := s.update(ctx, ns, []op{{kind: o, item: kind, name: name, digest: digest, at: s.now()}})
	if errors.Is(err, errNothingPending) {
		return Event{}, fmt.Errorf("%s %q of %s has no pending change %s: run `caddy zidane tools list %s` to see what is pending", kind, name, ns, digest, ns)
	}
	if err != nil {
		return Event{}, err
	}
	s.mu.Lock()
	if sp.newer(doc, true) {
		sp.setDoc(doc, sum)
	}
	s.mu.Unlock()
	for _, ev := range events {
		s.onEvent(ev)
	}
	return events[0], nil
}

// Approve pins the pending change of an item of ns whose digest is digest
// ("" for whichever is pending).
func (s *Store) Approve(ctx context.Context, ns string, kind Kind, name, digest string) (Event, error) {
	return s.decide(ctx, ns, kind, name, s.pendingDigest(ns, kind, name, digest), opApprove)
}

// Reject marks the pending change of an item rejected: it stays withheld
// (strict mode) while the upstream lists that definition, with no new
// audit line for it.
func (s *Store) Reject(ctx context.Context, ns string, kind Kind, name, digest string) (Event, error) {
	return s.decide(ctx, ns, kind, name, s.pendingDigest(ns, kind, name, digest), opReject)
}

func (s *Store) pendingDigest(ns string, kind Kind, name, digest string) string {
	if digest != "" {
		return digest
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp := s.spaces[ns]; sp != nil {
		if rec := sp.doc.records(kind)[name]; rec != nil && rec.Pending != nil {
			return rec.Pending.Digest
		}
	}
	return "(none)"
}

// ItemState is what List shows of one item.
type ItemState struct {
	Kind string `json:"kind"`
	// Name is the upstream's own name of a tool or prompt, a resource's
	// uri, a resource template's uriTemplate, or instructions or
	// serverInfo.
	Name string `json:"name"`
	// Digest is the pinned definition's; empty for a tool held as new.
	Digest   string    `json:"digest,omitempty"`
	PinnedAt time.Time `json:"pinned_at"`
	Approved bool      `json:"approved,omitempty"`
	// Pending is the changed (or new) definition waiting for an operator.
	Pending *PendingState `json:"pending,omitempty"`
}

// PendingState is a change waiting for an operator.
type PendingState struct {
	Digest   string    `json:"digest"`
	Seen     time.Time `json:"seen"`
	Rejected bool      `json:"rejected,omitempty"`
	// New is set for a tool new to its set (no pinned definition).
	New    bool     `json:"new,omitempty"`
	Fields []string `json:"changed_fields"`
}

// Namespace is what List shows of a namespace.
type Namespace struct {
	Name     string `json:"namespace"`
	Mode     string `json:"mode"`
	NewTools string `json:"new_tools"`
	Loaded   bool   `json:"loaded"`
	// ToolSet is set once its tools were listed whole: a tool first seen
	// since is new (held when NewTools is hold).
	ToolSet bool        `json:"tool_set"`
	Items   []ItemState `json:"items"`
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
		view := Namespace{Name: n, Mode: sp.policy.Mode.String(), NewTools: sp.policy.NewTools.String(), Loaded: sp.loaded,
			ToolSet: sp.doc.ToolSet, Items: []ItemState{}}
		for k := range numKinds {
			recs := sp.doc.records(k)
			for _, name := range sortedNames(recs) {
				rec := recs[name]
				st := ItemState{Kind: k.String(), Name: name, Digest: rec.Pinned.Digest, PinnedAt: rec.PinnedAt, Approved: rec.Approved}
				if p := rec.Pending; p != nil {
					st.Pending = &PendingState{Digest: p.Digest, Seen: p.Seen, Rejected: p.Rejected, New: rec.Pinned.Digest == "",
						Fields: ChangedFields(Diff(rec.Pinned, p.Definition))}
				}
				view.Items = append(view.Items, st)
			}
		}
		out = append(out, view)
	}
	return out, nil
}

// ItemDiff is what DiffOf shows of an item's pending change.
type ItemDiff struct {
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	// Pinned is empty for a tool new to its set.
	Pinned   string      `json:"pinned"`
	Pending  string      `json:"pending"`
	Rejected bool        `json:"rejected,omitempty"`
	Fields   []FieldDiff `json:"fields"`
}

// DiffOf shows an item's pending change, member by member.
func (s *Store) DiffOf(ns string, kind Kind, name string) (ItemDiff, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spaces[ns]
	if sp == nil {
		return ItemDiff{}, fmt.Errorf("no route of this gateway pins %q", ns)
	}
	rec := sp.doc.records(kind)[name]
	switch {
	case rec == nil:
		return ItemDiff{}, fmt.Errorf("%s has no pin of %s %q (it has not been listed through the gateway; pass --kind for a prompt, resource, resource_template or server item)", ns, kind, name)
	case rec.Pending == nil:
		return ItemDiff{}, fmt.Errorf("%s %q of %s has no pending change: its listing is the pinned definition %s", kind, name, ns, rec.Pinned.Digest)
	}
	return ItemDiff{Namespace: ns, Kind: kind.String(), Name: name, Pinned: rec.Pinned.Digest, Pending: rec.Pending.Digest, Rejected: rec.Pending.Rejected,
		Fields: Diff(rec.Pinned, rec.Pending.Definition)}, nil
}
