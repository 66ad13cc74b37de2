//go:build !linux

package confine

import (
	"errors"
	"runtime"
)

// MinABI is the Landlock ABI a policy needs unless BestEffort.
const MinABI = 4

var errNoLandlock = errors.New("agents can be confined on Linux only (Landlock); this is " + runtime.GOOS + ": set `sandbox off` on the agent to run it unconfined")

// ABI is 0: Landlock is Linux's.
func ABI() int { return 0 }

// Check says that this system cannot confine agents.
func Check() error { return errNoLandlock }

// Exec fails: there is no sandbox here, and best effort does not make one.
func Exec(Policy, []string) error { return errNoLandlock }

// Apply fails as Exec does.
func Apply(Policy, []string) error { return errNoLandlock }
