package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// profileCaddy writes a CPU profile of the gateway's caddy to cfg.cpuProfile
// (or, with -profile-kind allocs, a profile of the heap allocations it made
// meanwhile), taken from its admin API (/debug/pprof/profile or allocs,
// with seconds) while the route whose name
// starts with cfg.profileRoute is driven with cfg.profileSessions sessions.
// The load is made of the same bounded drives as the table's (at most two
// per second of profile, plus one), and ends when the profile does.
func profileCaddy(ctx context.Context, cfg config, gw *gateway, routes []route) error {
	var target *route
	for i := range routes {
		if strings.HasPrefix(routes[i].name, cfg.profileRoute) {
			target = &routes[i]
			break
		}
	}
	if target == nil {
		var names []string
		for _, r := range routes {
			names = append(names, r.name)
		}
		return fmt.Errorf("-profile-route %q names none of the routes %q", cfg.profileRoute, names)
	}
	if target.pid != gw.pid() {
		return fmt.Errorf("-profile-route %q does not go through caddy", target.name)
	}
	kind, endpoint := "CPU", "profile"
	if cfg.profileKind == "allocs" {
		kind, endpoint = "allocation", "allocs"
	}
	fmt.Fprintf(os.Stderr, "bench: %s profile of caddy for %s while %s is driven at %d sessions\n", kind, cfg.profileFor, target.name, cfg.profileSessions)
	pctx, cancel := context.WithTimeout(ctx, cfg.profileFor+time.Minute)
	defer cancel()
	type answer struct {
		data []byte
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		url := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", gw.admin, endpoint, int(cfg.profileFor.Seconds()))
		req, err := http.NewRequestWithContext(pctx, http.MethodGet, url, nil)
		if err != nil {
			done <- answer{err: err}
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("admin API answered %s: %s", resp.Status, data)
		}
		done <- answer{data, err}
	}()
	// Enough calls per drive to keep it busy for a second or more, never an
	// unbounded loop: at most two drives per second of profile, plus one.
	calls := max(50, 4000/cfg.profileSessions)
	// The calls made while the profile ran, so that its samples can be
	// read per call: the drives that ended before the profile did (the
	// last one may run past it, and is not counted).
	made, start := 0, time.Now()
	for i := 0; i <= 2*int(cfg.profileFor.Seconds()); i++ {
		select {
		case a := <-done:
			return writeProfile(kind, cfg.cpuProfile, a.data, a.err, made, time.Since(start))
		default:
		}
		s, err := drive(pctx, *target, cfg.profileSessions, calls, cfg.tool)
		if err != nil {
			return fmt.Errorf("driving %s for the profile: %w", target.name, err)
		}
		made += s.calls
	}
	a := <-done
	return writeProfile(kind, cfg.cpuProfile, a.data, a.err, made, time.Since(start))
}

func writeProfile(kind, path string, data []byte, err error, calls int, driven time.Duration) error {
	if err != nil {
		return fmt.Errorf("taking the %s profile: %w", kind, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: wrote the %s profile to %s (go tool pprof -top %s); %d tools/call finished in the %s it was driven, %.0f per second\n",
		kind, path, path, calls, driven.Round(time.Millisecond), float64(calls)/driven.Seconds())
	return nil
}
