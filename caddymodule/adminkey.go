package caddymodule

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// The admin routes that change state (tokens, upstream logins, restarts)
// need a key that only Caddy's user on this host can read: the admin API
// listens on loopback, where any local process, an agent included, can
// reach it. The key is made with crypto/rand at the first start and kept in
// Caddy's storage next to the tokens (Caddy's file storage writes it 0600,
// in 0700 directories); the `caddy zidane` CLI reads it from the same
// storage and sends it. On NATS storage (storage zidane_nats), which every
// replica and every holder of NATS credentials can read, the key stays in
// this host's file storage instead (adminKeyStorage): it guards this
// host's admin API, and a secret is never kept in plaintext where others
// read.

// The admin key travels as "Authorization: Zidane-Admin-Key <key>":
// Caddy's admin API logs the headers of every request it receives but
// Authorization and Cookie, so a header of its own would put the key in the
// log.
const (
	adminKeyScheme = "Zidane-Admin-Key"
	adminKeyHeader = "Authorization"
)

// adminKeyStorageKey is where the key is stored.
const adminKeyStorageKey = "zidane/admin.key"

var adminKeys sync.Map // storageKey -> string

// adminKeyStorage is the storage that holds the admin key of a server on
// st: st itself, or this host's file storage when st is shared.
func adminKeyStorage(st storage.Storage) storage.Storage {
	if _, shared := st.(*cluster.Storage); shared {
		return caddy.DefaultStorage
	}
	return st
}

// loadAdminKey returns the admin key of st, making it first when create is
// set and there is none.
func loadAdminKey(st storage.Storage, create bool) (string, error) {
	id := storageKey(st)
	if k, ok := adminKeys.Load(id); ok {
		return k.(string), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := st.Load(ctx, adminKeyStorageKey)
	switch {
	case err == nil:
	case storage.IsNotExist(err) && create:
		err = storage.Update(ctx, st, adminKeyStorageKey, func(old []byte) ([]byte, error) {
			if len(old) > 0 {
				raw = old // another process made it meanwhile
				return old, nil
			}
			b := make([]byte, 32)
			if _, err := rand.Read(b); err != nil {
				return nil, err
			}
			raw = []byte(base64.RawURLEncoding.EncodeToString(b))
			return raw, nil
		})
		if err != nil {
			return "", fmt.Errorf("zidane: making the admin key (%s in Caddy's storage): %w", adminKeyStorageKey, err)
		}
	default:
		return "", fmt.Errorf("zidane: reading the admin key (%s in Caddy's storage): %w", adminKeyStorageKey, err)
	}
	key := strings.TrimSpace(string(raw))
	if key == "" {
		return "", fmt.Errorf("zidane: the admin key (%s in Caddy's storage) is empty; delete it and restart caddy to make a new one", adminKeyStorageKey)
	}
	adminKeys.Store(id, key)
	return key, nil
}

// errNoAdminKey is the refusal of a state-changing admin request without
// the key.
var errNoAdminKey = errors.New("this admin route changes the gateway's state, or shows what only the operator may see, and needs the admin key (Authorization: " + adminKeyScheme +
	" <key>): use the `caddy zidane` CLI on this host, as the user caddy runs as (it reads the key from Caddy's storage, " + adminKeyStorageKey + ")")

// keyed wraps a handler of the zidane admin routes: a request that may
// change state (anything but GET and HEAD) must carry the admin key.
func (a *adminAPI) keyed(h caddy.AdminHandlerFunc) caddy.AdminHandlerFunc {
	return a.keyedIf(h, false)
}

// keyedReads wraps a handler whose reads show what only the operator may
// see (the arguments of the calls that approve rules hold, which may carry
// anyone's secrets): every request must carry the admin key.
func (a *adminAPI) keyedReads(h caddy.AdminHandlerFunc) caddy.AdminHandlerFunc {
	return a.keyedIf(h, true)
}

func (a *adminAPI) keyedIf(h caddy.AdminHandlerFunc, reads bool) caddy.AdminHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if !reads && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			return h(w, r)
		}
		want, err := loadAdminKey(adminKeyStorage(a.store()), true)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
		}
		scheme, got, _ := strings.Cut(r.Header.Get(adminKeyHeader), " ")
		if !strings.EqualFold(scheme, adminKeyScheme) || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(want)) != 1 {
			auditLogger().Warn("admin request refused", zap.String("event", "admin_refused"), zap.String("method", r.Method),
				zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr), zap.Bool("key_given", got != ""))
			return caddy.APIError{HTTPStatus: http.StatusForbidden, Err: errNoAdminKey}
		}
		return h(w, r)
	}
}

// cliAdminHeaders are the headers the CLI sends to the admin API: the
// admin key of Caddy's default storage, when this user can read it.
func cliAdminHeaders() http.Header {
	h := http.Header{}
	if key, err := loadAdminKey(caddy.DefaultStorage, false); err == nil {
		h.Set(adminKeyHeader, adminKeyScheme+" "+key)
	}
	return h
}
