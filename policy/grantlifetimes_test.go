package policy

import (
	"strings"
	"testing"
	"time"
)

// TestCheckGrantLifetimes: the lifetimes CreateGrant refuses are refused,
// with its words; the defaults and lifetimes within bounds pass.
func TestCheckGrantLifetimes(t *testing.T) {
	for _, tc := range []struct {
		access, refresh time.Duration
		want            string
	}{
		{0, 0, ""},
		{5 * time.Minute, 720 * time.Hour, ""},
		{25 * time.Hour, 0, "an access token lives 1s to"},
		{time.Millisecond, 0, "an access token lives 1s to"},
		{0, time.Millisecond, "a refresh token lives at least 1s"},
		{-time.Second, 0, "must be positive"},
	} {
		err := CheckGrantLifetimes(tc.access, tc.refresh)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckGrantLifetimes(%v, %v) = %v, want %q", tc.access, tc.refresh, err, tc.want)
		}
	}
}
