package policy

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Derived tokens. The gateway mints a token for a session's agent when it
// launches the agent: an orchestrator's token for the sessions endpoint, an
// egress token for the upstreams given to sessions. Each one
//
//   - has a parent, the credential that created the session (a token of the
//     store, or a JWT subject), the parent's owner, the parent's roots or
//     roots inside them, and the one resource of a grant it derives from;
//   - expires no later than its parent (Check also refuses it as soon as a
//     parent up its chain is revoked, expired or gone);
//   - is one of at most one per (session, purpose): a relaunch gives the same
//     record a new secret, so relaunches never add tokens;
//   - is deleted when its session ends or is dropped, and revoked with its
//     parent or its session (RevokeSession).

// ChildSpec asks for the token of one session's agent.
type ChildSpec struct {
	// Parent is who created the session: a token of this store, by TokenID
	// (its record decides owner and expiry), or a JWT principal
	// ("jwt:<sub>"), whose Expires and Issued bound the child.
	Parent Principal
	// Session is the session whose agent holds the token.
	Session string
	// Purpose is what the token is for: PurposeOrchestrator (scopes
	// sessions:<verb> and interactions:<verb>, a user token) or
	// PurposeEgress (scopes upstream:<name>, a machine token).
	Purpose Purpose
	Scopes  []string
	// Roots narrow the parent's roots (see Token.Roots); empty gives the
	// child its parent's.
	Roots []string
}

// Revocation is what RevokeSession and RevokeSubject did.
type Revocation struct {
	// Subject is the JWT subject revoked ("jwt:<sub>"), for RevokeSubject.
	Subject string `json:"subject,omitempty"`
	// Session is the session whose tokens were revoked, for RevokeSession.
	Session string `json:"session,omitempty"`
	// Tokens are the tokens revoked (RevokeSession) or deleted
	// (RevokeSubject), without their hashes.
	Tokens []Token `json:"tokens"`
}

// childName is the name of a session's token for purpose: one per session
// and purpose, so the name says which.
func childName(session string, purpose Purpose) string {
	return string(purpose) + "-" + session
}

// checkChildScopes refuses scopes that do not fit purpose, and, for an
// orchestrator whose parent holds only verb scopes (a token that is itself
// a narrowed child, or one an operator gave single verbs), scopes that the
// parent lacks. A parent holding a rule scope such as chat may grant the
// verbs that rule grants; which those are is the scope map's to say, and the
// sessions endpoint checks an orchestrator's tools against it at create.
func checkChildScopes(spec ChildSpec, parentScopes []string, tokenParent bool) error {
	if len(spec.Scopes) == 0 {
		return fmt.Errorf("%w: a %s token needs at least one scope", ErrNoChild, spec.Purpose)
	}
	for _, sc := range spec.Scopes {
		switch spec.Purpose {
		case PurposeOrchestrator:
			tool, verb, ok := strings.Cut(sc, ":")
			if !ok || !slices.Contains(SessionTools, tool) || verb == "" || verb == AnyOwner {
				return fmt.Errorf("%w: scope %q is not a verb of the sessions or interactions tool", ErrNoChild, sc)
			}
		case PurposeEgress:
			if !strings.HasPrefix(sc, UpstreamScope("")) || sc == UpstreamScope("") {
				return fmt.Errorf("%w: scope %q of an egress token is not an upstream scope", ErrNoChild, sc)
			}
		}
	}
	if spec.Purpose != PurposeOrchestrator || !tokenParent || !onlyVerbScopes(parentScopes) {
		return nil
	}
	var wider []string
	for _, sc := range spec.Scopes {
		if !slices.Contains(parentScopes, sc) {
			wider = append(wider, sc)
		}
	}
	if len(wider) > 0 {
		return fmt.Errorf("%w: the parent token holds %s, not %s: a child's verbs can only narrow its parent's", ErrNoChild,
			strings.Join(parentScopes, ", "), strings.Join(wider, ", "))
	}
	return nil
}

// onlyVerbScopes reports whether every scope is a "<tool>:<…>" scope of a
// sessions-endpoint tool.
func onlyVerbScopes(scopes []string) bool {
	for _, sc := range scopes {
		tool, _, ok := strings.Cut(sc, ":")
		if !ok || !slices.Contains(SessionTools, tool) {
			return false
		}
	}
	return len(scopes) > 0
}

// chainProblem says why t may not authenticate because of its parents: one
// of them is revoked, expired or gone, or the JWT subject they derive from
// was revoked after t was made.
func chainProblem(byID map[string]*Token, subjects map[string]time.Time, t *Token, now time.Time) error {
	child := t
	for range maxParentChain {
		if child.Parent == "" {
			return nil
		}
		if IsJWTID(child.Parent) {
			if at, ok := subjects[child.Parent]; ok && !t.Created.After(at) {
				return fmt.Errorf("%w: %q derives from JWT subject %q, which was revoked at %s", ErrTokenRevoked, t.Name, strings.TrimPrefix(child.Parent, JWTPrefix), at.UTC().Format(time.RFC3339))
			}
			return nil
		}
		p := byID[child.Parent]
		switch {
		case p == nil:
			return fmt.Errorf("%w: %q derives from a token that no longer exists", ErrTokenRevoked, t.Name)
		case p.Revoked != nil:
			return fmt.Errorf("%w: %q derives from %q, which was revoked at %s", ErrTokenRevoked, t.Name, p.Name, p.Revoked.UTC().Format(time.RFC3339))
		case p.Expires != nil && !now.Before(*p.Expires):
			return fmt.Errorf("%w: %q derives from %q, which expired at %s", ErrTokenExpired, t.Name, p.Name, p.Expires.UTC().Format(time.RFC3339))
		case lapsed(p, now):
			return fmt.Errorf("%w: %q derives from grant %s, whose refresh token lapsed unused at %s", ErrTokenExpired, t.Name, p.ID, p.Refresh.Expires.UTC().Format(time.RFC3339))
		}
		child = p
	}
	return fmt.Errorf("%w: %q derives from more than %d generations of tokens", ErrTokenRevoked, t.Name, maxParentChain)
}

// lapsed reports whether t is a grant whose refresh token lapsed unused:
// its client can get no access token any more, and what derives from it
// ends with it, as with an expired parent.
func lapsed(t *Token, now time.Time) bool {
	return t.Refresh != nil && !now.Before(t.Refresh.Expires)
}

// earlier is the earlier of two expiries, nil meaning never.
func earlier(a, b *time.Time) *time.Time {
	switch {
	case a == nil:
		return b
	case b == nil || a.Before(*b):
		return a
	}
	return b
}

// CreateChild mints the token of one session's agent, or, when the session
// already has one for this purpose, gives that record a new secret: tokens
// are stored hashed, so a relaunched agent cannot be handed the old secret,
// and keeping the record keeps the tokens derived from it (an orchestrator's
// workers' tokens) attached. The secret is returned once.
//
// The token gets its parent's owner and expires with its parent. Errors
// wrap ErrNoChild and say why: the parent is revoked, expired or gone (a
// JWT's exp passed, or its subject was revoked after it was issued), the
// scopes are wider than the parent's (see checkChildScopes), or the session's
// token was revoked (RevokeSession), which a relaunch does not undo.
func (s *TokenStore) CreateChild(ctx context.Context, spec ChildSpec) (string, Token, error) {
	kind, err := childKind(spec)
	if err != nil {
		return "", Token{}, err
	}
	secret := NewTokenSecret()
	now := time.Now().UTC().Truncate(time.Second)
	var out Token
	var action string
	err = s.update(ctx, func(f *tokenFile) error {
		action = ""
		inh, err := inherited(f, spec, now)
		if err != nil {
			return err
		}
		mine, act, err := childRecord(f, spec, now)
		if err != nil {
			return err
		}
		action = act
		mine.SHA256 = HashSecret(secret)
		mine.Scopes = append([]string(nil), spec.Scopes...)
		mine.Kind = kind
		mine.Parent = spec.Parent.TokenID
		mine.Owner = inh.owner
		mine.Expires = inh.expires
		mine.Roots = inh.roots
		mine.Resource = inh.resource
		out = *mine
		return nil
	})
	if err != nil {
		return "", Token{}, err
	}
	s.emit(TokenEvent{Action: action, Token: out})
	return secret, out, nil
}

// childKind checks what spec names before the token file is read, and
// returns the kind of the child token its purpose makes.
func childKind(spec ChildSpec) (Kind, error) {
	if !sessionPattern.MatchString(spec.Session) {
		return "", fmt.Errorf("%w: session id %q is not one this gateway makes", ErrNoChild, spec.Session)
	}
	var kind Kind
	switch spec.Purpose {
	case PurposeOrchestrator:
		kind = KindUser
	case PurposeEgress:
		kind = KindMachine
	default:
		return "", fmt.Errorf("%w: unknown purpose %q", ErrNoChild, spec.Purpose)
	}
	if spec.Parent.TokenID == "" {
		return "", fmt.Errorf("%w: session %s has no creator to derive a token from", ErrNoChild, spec.Session)
	}
	return kind, nil
}

// inheritance is what a child token takes from its parent: its owner, an
// expiry no later than any of its ancestors', roots within theirs, and the
// one resource a grant up its chain is for. A grant's child is handed to
// an agent, hostile code on the host; taken at every site of the gateway,
// it would reach resources the person never let the client reach.
type inheritance struct {
	owner    string
	expires  *time.Time
	roots    []string
	resource string
}

// inherited checks that the parent of spec, a JWT subject or a token of f,
// may derive the child at now, and returns what the child inherits, its
// roots narrowed to spec.Roots.
func inherited(f *tokenFile, spec ChildSpec, now time.Time) (inheritance, error) {
	parentID := spec.Parent.TokenID
	byID := make(map[string]*Token, len(f.Tokens))
	for _, t := range f.Tokens {
		byID[t.ID] = t
	}
	subjects := make(map[string]time.Time, len(f.Subjects))
	for _, r := range f.Subjects {
		subjects[r.Subject] = r.Revoked
	}
	var inh inheritance
	if IsJWTID(parentID) {
		exp := spec.Parent.Expires
		if exp == nil || !now.Before(*exp) {
			return inheritance{}, fmt.Errorf("%w: the JWT that created session %s has expired: the owner's next call with a fresh one renews it", ErrNoChild, spec.Session)
		}
		if at, ok := subjects[parentID]; ok && (spec.Parent.Issued == nil || !spec.Parent.Issued.After(at)) {
			return inheritance{}, fmt.Errorf("%w: JWT subject %q was revoked at %s, after the JWT that created session %s was issued", ErrNoChild,
				strings.TrimPrefix(parentID, JWTPrefix), at.UTC().Format(time.RFC3339), spec.Session)
		}
		if err := checkChildScopes(spec, nil, false); err != nil {
			return inheritance{}, err
		}
		inh = inheritance{owner: parentID, expires: exp, roots: spec.Parent.Roots}
	} else {
		p := byID[parentID]
		switch {
		case p == nil:
			return inheritance{}, fmt.Errorf("%w: the token that created session %s no longer exists", ErrNoChild, spec.Session)
		case p.Revoked != nil:
			return inheritance{}, fmt.Errorf("%w: the token %q that created session %s was revoked", ErrNoChild, p.Name, spec.Session)
		case p.Expires != nil && !now.Before(*p.Expires):
			return inheritance{}, fmt.Errorf("%w: the token %q that created session %s expired at %s", ErrNoChild, p.Name, spec.Session, p.Expires.UTC().Format(time.RFC3339))
		case lapsed(p, now):
			return inheritance{}, fmt.Errorf("%w: the grant %s that created session %s lapsed unused at %s", ErrNoChild, p.ID, spec.Session, p.Refresh.Expires.UTC().Format(time.RFC3339))
		}
		if err := chainProblem(byID, subjects, p, now); err != nil {
			return inheritance{}, fmt.Errorf("%w: the token that created session %s may not be used: %v", ErrNoChild, spec.Session, err)
		}
		if err := checkChildScopes(spec, p.Scopes, true); err != nil {
			return inheritance{}, err
		}
		inh.owner, inh.roots, inh.resource = p.OwnerID(), p.Roots, p.Resource
		for a := p; a != nil; a = byID[a.Parent] {
			inh.expires = earlier(inh.expires, a.Expires)
			if a.Parent == "" || IsJWTID(a.Parent) {
				break
			}
		}
	}
	want := make([]string, 0, len(spec.Roots))
	for _, r := range spec.Roots {
		if !filepath.IsAbs(r) {
			return inheritance{}, fmt.Errorf("%w: root %q is not an absolute path", ErrNoChild, r)
		}
		want = append(want, filepath.Clean(r))
	}
	roots, err := narrowRoots(inh.roots, want)
	if err != nil {
		return inheritance{}, fmt.Errorf("%w: %v", ErrNoChild, err)
	}
	inh.roots = roots
	return inh, nil
}

// childRecord is the record of the child token of spec in f: the one a
// relaunch of its agent rotates, or a new one added to f. action says
// which, for the audit log. A revoked one is not renewed.
func childRecord(f *tokenFile, spec ChildSpec, now time.Time) (mine *Token, action string, err error) {
	for _, t := range f.Tokens {
		if t.Session == spec.Session && t.Purpose == spec.Purpose {
			mine = t
			break
		}
	}
	if mine != nil && mine.Revoked != nil {
		return nil, "", fmt.Errorf("%w: the %s token of session %s was revoked at %s, and is not renewed: create a new session", ErrNoChild,
			spec.Purpose, spec.Session, mine.Revoked.UTC().Format(time.RFC3339))
	}
	if mine != nil {
		return mine, "rotated", nil
	}
	mine = &Token{ID: newTokenID(), Name: childName(spec.Session, spec.Purpose), Created: now, Session: spec.Session, Purpose: spec.Purpose}
	if err := nameFree(f, mine.Name); err != nil {
		return nil, "", err
	}
	f.Tokens = append(f.Tokens, mine)
	return mine, "created", nil
}

// nameFree refuses a name a live token has.
func nameFree(f *tokenFile, name string) error {
	for _, t := range f.Tokens {
		if t.Name == name && t.Revoked == nil && !t.IsGrant() {
			return fmt.Errorf("a token named %q already exists: revoke it first or choose another name", name)
		}
	}
	return nil
}

// withDescendants adds to ids every token of f derived, at any depth, from
// one of them.
func withDescendants(f *tokenFile, ids map[string]bool) {
	// A token file is small: loop to a fixed point.
	for changed := true; changed; {
		changed = false
		for _, t := range f.Tokens {
			if !ids[t.ID] && t.Parent != "" && ids[t.Parent] {
				ids[t.ID] = true
				changed = true
			}
		}
	}
}

// deleteIDs removes the tokens of f whose ids are in ids and returns them.
func deleteIDs(f *tokenFile, ids map[string]bool) []Token {
	var gone []Token
	kept := f.Tokens[:0]
	for _, t := range f.Tokens {
		if ids[t.ID] {
			gone = append(gone, *t)
			continue
		}
		kept = append(kept, t)
	}
	clear(f.Tokens[len(kept):])
	f.Tokens = kept
	return gone
}

// DeleteSession deletes the tokens minted for session's agent and every
// token derived from them: the session ended or was dropped, so nothing may
// act for it any more. What the deleted tokens hold is cancelled, as for a
// revocation. Deleting, rather than revoking, keeps the token file bounded
// however many sessions come and go; each deletion is audited.
func (s *TokenStore) DeleteSession(ctx context.Context, session string) ([]Token, error) {
	if session == "" || !s.hasSession(session) {
		return nil, nil // most sessions have no token: no write for them
	}
	return s.deleteWhere(ctx, func(t *Token) bool { return t.Session == session })
}

// hasSession reports whether some token was minted for session.
func (s *TokenStore) hasSession(session string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, t := range s.byID {
		if t.Session == session {
			return true
		}
	}
	return false
}

// announce audits each token with action and runs the revoke hooks, so
// that what the tokens hold is cancelled.
func (s *TokenStore) announce(action string, list []Token) {
	for _, t := range list {
		t.SHA256 = ""
		s.emit(TokenEvent{Action: action, Token: t})
		s.fireRevoke(t)
	}
}

// RevokeSession revokes the tokens minted for session's agent and every
// token derived from them (the tokens of the workers an orchestrator
// created). The records stay, revoked, until the session ends, so the
// session's next launch does not renew them: its agent runs without them.
func (s *TokenStore) RevokeSession(ctx context.Context, session string) (Revocation, error) {
	var revoked []Token
	err := s.update(ctx, func(f *tokenFile) error {
		revoked = revoked[:0]
		ids := map[string]bool{}
		for _, t := range f.Tokens {
			if t.Session == session {
				ids[t.ID] = true
			}
		}
		if len(ids) == 0 {
			return fmt.Errorf("%w for session %q: the gateway minted none for it, or the session ended and they were deleted; check the id with sessions list", ErrTokenNotFound, session)
		}
		withDescendants(f, ids)
		now := time.Now().UTC().Truncate(time.Second)
		for _, t := range f.Tokens {
			if ids[t.ID] && t.Revoked == nil {
				t.Revoked = &now
				revoked = append(revoked, *t)
			}
		}
		return nil
	})
	if err != nil {
		return Revocation{}, err
	}
	s.announce("revoked", revoked)
	return Revocation{Session: session, Tokens: redacted(revoked)}, nil
}

// RevokeSubject revokes the JWT subject id ("jwt:<sub>"): its access tokens
// issued until now are refused from now on (a fresh one, issued later, is
// accepted: the identity provider decides whether the subject gets one),
// what its requests hold is cancelled (open streams, running sessions), and
// the tokens derived from it are deleted.
func (s *TokenStore) RevokeSubject(ctx context.Context, id string) (Revocation, error) {
	sub, ok := strings.CutPrefix(id, JWTPrefix)
	if !ok || sub == "" {
		return Revocation{}, fmt.Errorf("%q is not a JWT subject: write jwt:<sub>, with the sub claim of the subject's access tokens", id)
	}
	now := time.Now().UTC().Truncate(time.Second)
	var gone []Token
	err := s.update(ctx, func(f *tokenFile) error {
		i := slices.IndexFunc(f.Subjects, func(r SubjectRevocation) bool { return r.Subject == id })
		if i < 0 {
			f.Subjects = append(f.Subjects, SubjectRevocation{Subject: id})
			i = len(f.Subjects) - 1
		}
		f.Subjects[i].Revoked = now
		ids := map[string]bool{id: true}
		withDescendants(f, ids)
		delete(ids, id)
		gone = deleteIDs(f, ids)
		return nil
	})
	if err != nil {
		return Revocation{}, err
	}
	s.announce("revoked", []Token{subjectToken(id, now)})
	s.announce("deleted", gone)
	return Revocation{Subject: id, Tokens: redacted(gone)}, nil
}

// subjectToken stands for a revoked JWT subject in events and revoke hooks,
// which know principals by TokenID.
func subjectToken(id string, at time.Time) Token {
	return Token{ID: id, Name: strings.TrimPrefix(id, JWTPrefix), Kind: KindUser, Owner: id, Revoked: &at}
}

// PruneDerived deletes the derived tokens that no session can use: those of
// a session for which live reports false (it ended, or this gateway no
// longer has it), those made before tokens recorded their session, and the
// tokens derived from any of them. The sessions engine runs it when it
// starts, to clear what a crash or an older version left behind.
func (s *TokenStore) PruneDerived(ctx context.Context, live func(session string) bool) ([]Token, error) {
	stale := func(t *Token) bool {
		return t.Parent != "" && (t.Session == "" || !live(t.Session))
	}
	s.mu.RLock()
	found := false
	for _, t := range s.byID {
		found = found || stale(t)
	}
	s.mu.RUnlock()
	if !found {
		return nil, nil
	}
	return s.deleteWhere(ctx, stale)
}

// deleteWhere deletes the tokens that match, with every token derived from
// them, and audits each deletion.
func (s *TokenStore) deleteWhere(ctx context.Context, match func(*Token) bool) ([]Token, error) {
	var gone []Token
	err := s.update(ctx, func(f *tokenFile) error {
		ids := map[string]bool{}
		for _, t := range f.Tokens {
			if match(t) {
				ids[t.ID] = true
			}
		}
		withDescendants(f, ids)
		gone = deleteIDs(f, ids)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.announce("deleted", gone)
	return gone, nil
}

func redacted(list []Token) []Token {
	out := make([]Token, len(list))
	for i, t := range list {
		t.SHA256 = ""
		out[i] = t
	}
	return out
}
