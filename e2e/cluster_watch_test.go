package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// tokensWatchBack is the line a replica logs once it has made its watch
// of the tokens again itself after its NATS connection came back, and read
// the tokens again.
const tokensWatchBack = `"msg":"NATS watch made again","watch":"zidane/tokens.json","reason":"the NATS connection came back"`

// watchHangGuard only bounds the waits below, so that a gateway that never
// gets there fails rather than hangs: a replica makes its watch again
// about a second after NATS is back, and a revocation reaches it at once.
const watchHangGuard = 30 * time.Second

// A token revoked on replica A just after NATS restarts is refused on
// replica B, run after run, with a restart each time. B's watch of the
// tokens went with the NATS server, and nats.go alone makes it again only
// 10 to 20 s later: B makes it again itself once its connection is back,
// which it logs, and the test waits for that line before revoking. With
// the default token_sync (1 s) B's periodic read would hide a missing
// watch; with token_sync 1m the watch is all there is, as for a
// deployment that reads the token file seldom. The lags are logged, not
// asserted.
func TestClusterTokenRevokedAfterNATSRestart(t *testing.T) {
	for _, tc := range []struct{ name, option string }{
		{"default token_sync", ""},
		{"the watch alone", "token_sync 1m"},
	} {
		t.Run(tc.name, func(t *testing.T) { revokeAfterNATSRestarts(t, tc.option) })
	}
}

func revokeAfterNATSRestarts(t *testing.T, option string) {
	const runs = 3
	nats := startNATS(t)
	up := startRecordingUpstream(t)
	clusterKey := "ZIDANE_CLUSTER_KEY=" + base64.StdEncoding.EncodeToString([]byte(randomHex(16)))
	replica := func() (*Caddy, string) {
		site := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		c := startCaddy(t, fmt.Sprintf(`{
	admin %s
	storage zidane_nats
	zidane {
		cluster {
			url %s
		}
		%s
	}
}

http://%s {
	zidane_mcp {
		guard
	}
	reverse_proxy %s
}
`, AdminPlaceholder, nats.url, option, site, up.addr), clusterKey)
		return c, "http://" + site + "/mcp"
	}
	a, _ := replica()
	b, urlB := replica()
	var lags []time.Duration
	for run := range runs {
		name := fmt.Sprintf("run-%d", run)
		token := createToken(t, a, name, "--scope", "mcp")
		waitStatus(t, urlB, token, http.StatusOK, watchHangGuard)

		from := b.LogSize()
		nats.stop()
		nats.start(t)
		back := time.Now()
		b.WaitForLogFrom(t, from, tokensWatchBack, watchHangGuard)
		watched := time.Since(back)
		if _, stderr, err := a.Run(t, "zidane", "token", "revoke", name); err != nil {
			t.Fatalf("run %d: token revoke on A just after NATS restarted: %v %s", run, err, stderr)
		}
		revoked := time.Now()
		lag := waitStatus(t, urlB, token, http.StatusUnauthorized, watchHangGuard)
		lags = append(lags, lag)
		t.Logf("run %d: B made its watch again %v after NATS was back; the revocation on A answered %v after that; B refused the token %v after that",
			run, watched.Round(time.Millisecond), revoked.Sub(back.Add(watched)).Round(time.Millisecond), lag.Round(time.Millisecond))
	}
	slices.Sort(lags)
	t.Logf("lag over %d runs: min %s, median %s, max %s", len(lags), lags[0].Round(time.Millisecond),
		lags[len(lags)/2].Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond))
}
