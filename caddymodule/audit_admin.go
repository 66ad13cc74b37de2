package caddymodule

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/auditchain"
	"github.com/Tahul/caddy-zidane-mcp/storage"
)

// keptCheckpointAnswer is the answer of GET /zidane/audit/checkpoints/<chain>:
// the checkpoint line ("" when none is kept), which verify checks with the
// public key it is given.
type keptCheckpointAnswer struct {
	Chain      string `json:"chain"`
	Log        string `json:"log,omitempty"`
	Node       string `json:"node,omitempty"`
	Checkpoint string `json:"checkpoint"`
	Key        string `json:"key"` // the storage key, for messages
}

// handleAuditCheckpoint answers GET /zidane/audit/checkpoints/<chain> with
// the latest checkpoint of an audit chain kept in the running config's
// storage, for `caddy zidane audit verify` (a storage in NATS is reached
// through here). A checkpoint is signed and holds no secret.
func (a *adminAPI) handleAuditCheckpoint(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("use GET /zidane/audit/checkpoints/<chain id>")}
	}
	chain := strings.TrimPrefix(r.URL.Path, "/zidane/audit/checkpoints/")
	if !auditchain.ValidChainID(chain) {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%q is not an audit chain id: give the %d hex digits that the log's checkpoints name as \"chain\"", chain, auditchain.ChainIDLen)}
	}
	st := a.store()
	key := auditCheckpointKey(chain)
	ans := keptCheckpointAnswer{Chain: chain, Key: key}
	raw, err := st.Load(r.Context(), key)
	switch {
	case storage.IsNotExist(err):
		return writeJSON(w, http.StatusOK, ans)
	case err != nil:
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("reading %s: %w", key, err)}
	}
	kc, err := decodeKeptCheckpoint(raw, key)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	ans.Log, ans.Node, ans.Checkpoint = kc.Log, kc.Node, kc.Checkpoint
	return writeJSON(w, http.StatusOK, ans)
}
