package clients

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/policy"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// registeredPrefix starts the client_id of every registered client, so
// that Resolve knows where to look without a storage read, and no
// registered id can be taken for a URL.
const registeredPrefix = "zdc_"

// registeredIDLength is the length of a registered client_id: the prefix
// and 16 random bytes in unpadded base64url.
var registeredIDLength = len(registeredPrefix) + base64.RawURLEncoding.EncodedLen(16)

// touchEvery is how stale a registered client's LastUsed may get before
// Resolve writes it again: at most one write a day per client.
const touchEvery = 24 * time.Hour

// registrationLock serializes registrations (and sweeps) across every
// process that shares the storage, so the bound on stored clients holds.
const registrationLock = StoragePrefix + "/.registration"

func newRegisteredID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return registeredPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// validRegisteredID reports whether id has the form of a registered
// client_id, so that nothing else reaches a storage key.
func validRegisteredID(id string) bool {
	if len(id) != registeredIDLength || !strings.HasPrefix(id, registeredPrefix) {
		return false
	}
	_, err := base64.RawURLEncoding.Strict().DecodeString(id[len(registeredPrefix):])
	return err == nil
}

func registeredKey(id string) string { return StoragePrefix + "/" + id }

func unknownRegistered() *Error {
	return refuse(CodeInvalidClient, "unknown_client", "client_id: no client is registered under this id (registered clients are forgotten after a time unused); register again")
}

// loadRegistered returns the registered client id, refreshing its
// LastUsed, or deletes it when it has expired.
func (r *Registry) loadRegistered(ctx context.Context, id string) (Client, error) {
	if !validRegisteredID(id) {
		return Client{}, unknownRegistered()
	}
	if r.cfg.Storage == nil {
		return Client{}, unknownRegistered()
	}
	raw, err := r.cfg.Storage.Load(ctx, registeredKey(id))
	if storage.IsNotExist(err) {
		return Client{}, unknownRegistered()
	}
	if err != nil {
		return Client{}, &Error{Code: CodeTemporarilyUnavailable, Reason: "storage", Description: "registered clients cannot be read right now; try again", Err: err}
	}
	var c Client
	if err := json.Unmarshal(raw, &c); err != nil || c.ID != id || c.Source != SourceRegistered {
		return Client{}, unknownRegistered()
	}
	now := r.cfg.Now()
	if r.expired(c, now) {
		_ = r.cfg.Storage.Delete(ctx, registeredKey(id))
		return Client{}, refuse(CodeInvalidClient, "expired", "client_id: this registration expired after "+r.cfg.RegisteredTTL.String()+" unused; register again")
	}
	if now.Sub(c.LastUsed) >= touchEvery {
		// Under the key's lock, and only if the client is still there: a
		// sweep that deleted it in between is not undone.
		_ = storage.Update(ctx, r.cfg.Storage, registeredKey(id), func(old []byte) ([]byte, error) {
			var cur Client
			if old == nil || json.Unmarshal(old, &cur) != nil {
				return nil, errGone
			}
			cur.LastUsed = now
			return json.Marshal(cur)
		})
		c.LastUsed = now
	}
	return c, nil
}

var errGone = errors.New("registered client gone")

func (r *Registry) expired(c Client, now time.Time) bool {
	return now.Sub(c.LastUsed) > r.cfg.RegisteredTTL
}

// registrationResponse is the client information answer (RFC 7591
// §3.2.1). It has no client_secret: registered clients are public.
type registrationResponse struct {
	ClientID                string   `json:"client_id"`
	ClientIDIssuedAt        int64    `json:"client_id_issued_at"`
	RedirectURIs            []string `json:"redirect_uris"`
	ClientName              string   `json:"client_name,omitempty"`
	ClientURI               string   `json:"client_uri,omitempty"`
	LogoURI                 string   `json:"logo_uri,omitempty"`
	Scope                   string   `json:"scope,omitempty"`
	GrantTypes              []string `json:"grant_types"`
	ResponseTypes           []string `json:"response_types"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method"`
}

// Register is the dynamic client registration endpoint (RFC 7591): use it
// as http.HandlerFunc(registry.Register) for POST on the registration
// endpoint. A registration is a JSON object of client metadata of at most
// MaxMetadataBytes, read by the same rules as a metadata document; the
// answer is 201 with the client information, or an RFC 7591 §3.2.2 error
// (invalid_redirect_uri, invalid_client_metadata), 403 access_denied when
// registration is off or the store is full, 429 when the address is over
// its limit, 405, 413 or 415 for a request of the wrong shape.
func (r *Registry) Register(w http.ResponseWriter, req *http.Request) {
	addr := r.clientAddress(req)
	status, err := r.register(w, req, addr)
	if err == nil {
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: CodeTemporarilyUnavailable, Reason: "storage", Description: "the registration could not be stored; try again"}
	}
	r.refused(Refusal{Kind: "registration", Address: addr, Code: e.Code, Reason: e.Reason})
	writeError(w, status, e)
}

func (r *Registry) register(w http.ResponseWriter, req *http.Request, addr string) (int, error) {
	if !r.cfg.Registration {
		return http.StatusForbidden, refuse(CodeAccessDenied, "registration_off", "dynamic client registration is off on this server; use an https URL of a client ID metadata document as client_id, or ask the operator to allow registration")
	}
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return http.StatusMethodNotAllowed, badMetadata("method", "register with POST")
	}
	now := r.cfg.Now()
	if ok, wait := r.limiter.Allow(policy.AddressKey(addr, policy.DefaultIPv6Prefix), now); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		return http.StatusTooManyRequests, refuse(CodeTemporarilyUnavailable, "rate_limited", "too many registrations from this address; try again after the Retry-After delay")
	}
	if mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return http.StatusUnsupportedMediaType, badMetadata("content_type", "send the client metadata as Content-Type: application/json")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxMetadataBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, badMetadata("too_large", "the client metadata is larger than "+strconv.Itoa(MaxMetadataBytes)+" bytes")
		}
		return http.StatusBadRequest, badMetadata("body", "the request body could not be read")
	}
	m, err := parseMetadata(body)
	if err != nil {
		return http.StatusBadRequest, err
	}
	c := Client{
		ID:           newRegisteredID(),
		Name:         m.name,
		RedirectURIs: m.redirectURIs,
		Source:       SourceRegistered,
		LogoURI:      m.logoURI,
		ClientURI:    m.clientURI,
		Scope:        m.scope,
		IssuedAt:     now.UTC().Truncate(time.Second),
		LastUsed:     now.UTC(),
	}
	if status, err := r.store(req.Context(), c); err != nil {
		return status, err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(registrationResponse{
		ClientID:                c.ID,
		ClientIDIssuedAt:        c.IssuedAt.Unix(),
		RedirectURIs:            c.RedirectURIs,
		ClientName:              c.Name,
		ClientURI:               c.ClientURI,
		LogoURI:                 c.LogoURI,
		Scope:                   c.Scope,
		GrantTypes:              []string{"authorization_code", "refresh_token"},
		ResponseTypes:           []string{"code"},
		TokenEndpointAuthMethod: "none",
	})
	return http.StatusCreated, nil
}

// store keeps c, within the bound on registered clients: under a lock
// every process sharing the storage takes, it counts the clients, sweeps
// the expired ones when the bound is reached, and refuses when it still
// is.
func (r *Registry) store(ctx context.Context, c Client) (int, error) {
	st := r.cfg.Storage
	if err := st.Lock(ctx, registrationLock); err != nil {
		return http.StatusServiceUnavailable, &Error{Code: CodeTemporarilyUnavailable, Reason: "storage", Description: "registration is busy; try again", Err: err}
	}
	defer st.Unlock(context.WithoutCancel(ctx), registrationLock)
	keys, err := r.registeredKeys(ctx)
	if err != nil {
		return http.StatusServiceUnavailable, err
	}
	if len(keys) >= r.cfg.MaxRegistered {
		if _, err := r.sweep(ctx, keys); err != nil {
			return http.StatusServiceUnavailable, err
		}
		if keys, err = r.registeredKeys(ctx); err != nil {
			return http.StatusServiceUnavailable, err
		}
	}
	if len(keys) >= r.cfg.MaxRegistered {
		return http.StatusForbidden, refuse(CodeAccessDenied, "store_full", "this server holds its most registered clients ("+strconv.Itoa(r.cfg.MaxRegistered)+"); use an https URL of a client ID metadata document as client_id, or try again once unused registrations expire")
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	if err := st.Store(ctx, registeredKey(c.ID), raw); err != nil {
		return http.StatusServiceUnavailable, &Error{Code: CodeTemporarilyUnavailable, Reason: "storage", Description: "the registration could not be stored; try again", Err: err}
	}
	return http.StatusCreated, nil
}

// registeredKeys lists the keys of registered clients.
func (r *Registry) registeredKeys(ctx context.Context) ([]string, error) {
	keys, err := r.cfg.Storage.List(ctx, StoragePrefix, false)
	if storage.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, &Error{Code: CodeTemporarilyUnavailable, Reason: "storage", Description: "registered clients cannot be listed right now; try again", Err: err}
	}
	out := keys[:0]
	for _, k := range keys {
		if validRegisteredID(k[strings.LastIndexByte(k, '/')+1:]) {
			out = append(out, k)
		}
	}
	return out, nil
}

// Sweep deletes the registered clients unused for longer than
// RegisteredTTL and says how many it deleted. Registration sweeps when the
// store is full; an operator's periodic task may call it too.
func (r *Registry) Sweep(ctx context.Context) (int, error) {
	if r.cfg.Storage == nil {
		return 0, nil
	}
	st := r.cfg.Storage
	if err := st.Lock(ctx, registrationLock); err != nil {
		return 0, err
	}
	defer st.Unlock(context.WithoutCancel(ctx), registrationLock)
	keys, err := r.registeredKeys(ctx)
	if err != nil {
		return 0, err
	}
	return r.sweep(ctx, keys)
}

func (r *Registry) sweep(ctx context.Context, keys []string) (int, error) {
	now := r.cfg.Now()
	n := 0
	for _, k := range keys {
		raw, err := r.cfg.Storage.Load(ctx, k)
		if storage.IsNotExist(err) {
			continue
		}
		if err != nil {
			return n, err
		}
		var c Client
		if json.Unmarshal(raw, &c) != nil || r.expired(c, now) {
			if err := r.cfg.Storage.Delete(ctx, k); err != nil && !storage.IsNotExist(err) {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// writeError answers an OAuth error (RFC 7591 §3.2.2, RFC 6749 §5.2).
func writeError(w http.ResponseWriter, status int, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}{e.Code, e.Description})
}
