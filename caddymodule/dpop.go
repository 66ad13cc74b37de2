package caddymodule

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/Tahul/caddy-zidane-mcp/cluster"
	"github.com/Tahul/caddy-zidane-mcp/dpop"
	"github.com/Tahul/caddy-zidane-mcp/edge"
)

// Values of Handler.DPoP.
const (
	dpopOptional = "optional"
	dpopRequired = "required"
)

// dpopLocalLimit bounds the proofs the replay check of one node holds at
// once (each at most 128 bytes: 32 MiB): some 2,000 proofs a second over
// the two windows each is kept. Past it, proofs are refused 503 until
// older ones are stale, never let in twice.
const dpopLocalLimit = 1 << 18

// dpopLocal is the replay check of a node without a cluster: one for the
// process, so that a config reload keeps the proofs taken (a proof taken
// before a reload is a replay after it), and every site of the process
// shares it (a proof names its URL, which the verifier checks first).
var dpopLocal = dpop.NewLocal(dpopLocalLimit, dpop.DefaultWindow)

// dpopNonceKey is the key of a node's DPoP nonces without a cluster: held
// in memory for the process, never written to storage, which agents on
// the host could read. A restart makes every client fetch a new nonce,
// which a use_dpop_nonce answer gives.
var dpopNonceKey = func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}()

// dpopReplays holds one cluster replay check per cluster storage, for the
// life of the process.
var dpopReplays sync.Map // *cluster.Storage -> *cluster.Replay

// checkDPoPOption refuses a DPoP configuration that cannot work, saying
// what to write instead. resource is the configured resource (parsed).
func checkDPoPOption(mode string, nonce bool, resource *url.URL) error {
	switch mode {
	case "", dpopOptional, dpopRequired:
	default:
		return fmt.Errorf("dpop %q: write `dpop optional` (bound tokens need their proof, bearer tokens are taken) or `dpop required` (DPoP-bound tokens only)", mode)
	}
	if (mode == dpopRequired || nonce) && !resource.IsAbs() {
		what := "dpop required"
		if mode != dpopRequired {
			what = "dpop_nonce"
		}
		return fmt.Errorf("%s: give `resource` as an absolute URL, such as https://mcp.example.com/mcp: a DPoP proof names the URL it is for, which a path alone does not, and the Host header is the client's to choose", what)
	}
	return nil
}

// provisionDPoP builds the site's DPoP check (edge.DPoP). A site whose
// resource is a path alone checks no proof: it refuses bound tokens (see
// edge.DPoP), since the only host it could check a proof's htu against is
// the one the client sent.
func (h *Handler) provisionDPoP(ctx caddy.Context) error {
	if err := checkDPoPOption(h.DPoP, h.DPoPNonce, h.resURL); err != nil {
		return err
	}
	h.dpop = edge.DPoP{Required: h.DPoP == dpopRequired}
	if !h.resURL.IsAbs() {
		return nil
	}
	replay, nonceKey, err := dpopShared(ctx.Storage())
	if err != nil {
		return fmt.Errorf("zidane_mcp dpop: %w", err)
	}
	v := &dpop.Verifier{Window: dpop.DefaultWindow, Replay: replay}
	if h.DPoPNonce {
		n, err := dpop.NewNonces(nonceKey, 0)
		if err != nil {
			return err
		}
		v.Nonces = n
	}
	h.dpop.Verifier, h.dpop.URL = v, h.resURL
	return nil
}

// dpopShared is the replay check of DPoP proofs and the key of DPoP nonces
// on storage st, for every verifier of the process (the edge's, the token
// endpoint's) with DefaultWindow: on a cluster's storage the cluster's
// replay check and a key derived from the cluster key, so that every
// replica takes a nonce any other issued and refuses a proof any other
// took; elsewhere the process's own.
func dpopShared(st any) (dpop.Replay, []byte, error) {
	cs, ok := st.(*cluster.Storage)
	if !ok {
		return dpopLocal, dpopNonceKey, nil
	}
	r, err := clusterReplay(cs)
	if err != nil {
		return nil, nil, err
	}
	key, err := cs.DeriveKey("dpop nonce v1")
	if err != nil {
		return nil, nil, err
	}
	return r, key, nil
}

// clusterReplay is the replay check on cluster storage cs, opened once.
func clusterReplay(cs *cluster.Storage) (*cluster.Replay, error) {
	if r, ok := dpopReplays.Load(cs); ok {
		return r.(*cluster.Replay), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := cs.Replay(ctx, dpop.DefaultWindow)
	if err != nil {
		return nil, err
	}
	actual, _ := dpopReplays.LoadOrStore(cs, r)
	return actual.(*cluster.Replay), nil
}
