package storage

// KeyLocks is how many keys this process holds an in-process lock entry
// for.
func KeyLocks() int {
	keyLocksMu.Lock()
	defer keyLocksMu.Unlock()
	return len(keyLocks)
}
