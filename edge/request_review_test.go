package edge

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A request to switch protocols is refused on every method: after a 101,
// the connection would carry bytes the edge never reads.
func TestCheckRequestRefusesUpgrade(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete, http.MethodOptions} {
		for _, up := range []string{"websocket", "h2c", "anything"} {
			r := httptest.NewRequest(method, "/mcp", nil)
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", up)
			if v := CheckRequest(r); v.Status != http.StatusBadRequest || v.Reason != ReasonUpgrade {
				t.Errorf("%s with Upgrade: %s: got %d %q; want 400 %q", method, up, v.Status, v.Reason, ReasonUpgrade)
			}
		}
	}
}
