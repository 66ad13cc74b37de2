package sessions

import "testing"

// The per-token limits default to a share of the global ones, so that an
// operator who changes max_sessions or max_agents keeps the same balance.
func TestPerTokenDefaults(t *testing.T) {
	for _, tc := range []struct {
		in                 Limits
		sessions, agents   int
		wantSess, wantAgts int
	}{
		{Limits{}, 1000, 64, 100, 16},
		{Limits{MaxSessions: 50, MaxAgents: 2}, 50, 2, 5, 1},
		{Limits{MaxSessions: 5, MaxAgents: 1}, 5, 1, 1, 1},
		{Limits{MaxSessionsPerToken: 7, MaxAgentsPerToken: 200}, 1000, 64, 7, 200},
	} {
		l := tc.in.withDefaults()
		if l.MaxSessions != tc.sessions || l.MaxAgents != tc.agents || l.MaxSessionsPerToken != tc.wantSess || l.MaxAgentsPerToken != tc.wantAgts {
			t.Errorf("%+v: sessions %d/%d per token, agents %d/%d per token; want %d/%d and %d/%d", tc.in,
				l.MaxSessions, l.MaxSessionsPerToken, l.MaxAgents, l.MaxAgentsPerToken, tc.sessions, tc.wantSess, tc.agents, tc.wantAgts)
		}
	}
}
