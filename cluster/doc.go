// Package cluster is what several replicas of the gateway share through
// NATS JetStream. It is the only package that imports nats.go.
//
// It holds [Storage], a certmagic.Storage on JetStream, for everything the
// file storage holds on a single node (tokens, sessions, upstream
// credentials, TLS certificates); on the storage's connection, the sharing
// of rate-limit usage ([LimitShare]) and of operators' actions ([Actions]),
// each on a sealed bus; the node registry ([Nodes]: each node's
// advertised address under its id, sealed, heartbeat every third of a TTL,
// dead one TTL after its last heartbeat), through which the aggregated
// route finds the replica that holds a session; sealed request/reply
// between nodes ([RPC]), through which any replica acts on an agent
// session where it runs; sealed event streams ([EventStream]), one
// sequence for the whole cluster; and node areas ([NodeArea]): what each
// node writes for its own part under zidane/nodes/<node>/<area>/ (the
// sessions directory), which every node follows with one watch and reads
// caught up; and the replay check of DPoP proofs ([Replay]: one KV bucket,
// each proof claimed once across the cluster by an atomic create).
//
// A watch ([Storage.Watch], a node area's, the node registry's) is made
// again as soon as the connection comes back after it was lost, and
// checked against the stream's leader every [WatchCheck]: NATS keeps the
// consumer behind a watch in one server's memory, and a restart of NATS
// loses it (see watch.go). Each watch made again is logged ("NATS watch
// made again", with what it follows and why), so an operator and the
// tests see that it was this package, not nats.go, that made it.
//
// The storage:
//
//   - values live in a KV bucket ("zidane" by default), one entry per key;
//     each path segment of a key is one KV token, escaped so that the
//     mapping is one-to-one and no key reaches NATS as a wildcard;
//   - a value over the inline limit (half the server's max payload, at most
//     512 KiB; transcripts reach megabytes) goes to an object store, which
//     chunks it (nats.go checks its SHA-256 digest when it reads it), and
//     the KV entry holds its name and size, sealed; an object is read only
//     if it is no link and of that size, and opens only under its name;
//     replacing or deleting the value deletes the object;
//   - locks are entries of a second KV bucket whose entries expire one lock
//     TTL (15 s by default; the longest any replica asked for, so that none
//     lowers it under another's locks) after they were last written. Lock creates its
//     entry only if there is none, the holder renews it every third of the
//     TTL by compare-and-set on its revision, and Unlock deletes it only at
//     the holder's revision. A holder whose renewal finds its entry gone or
//     taken has lost the lock: what it writes under it is refused
//     ([ErrLockLost]);
//   - writes are fenced: a key read under the lock of the same name (the
//     read-modify-write of storage.Update) is written back by
//     compare-and-set on the revision that was read, so a holder that
//     stalled past its TTL while another took the lock and wrote cannot
//     overwrite that write ([ErrFenced]). A Delete of a key read under its
//     lock is fenced the same way, so a stale holder takes nothing twice
//     (a pending login, read and deleted under its lock). The fence is the
//     revision first read under the lock: a later read, which may see the
//     other holder's write, does not move it;
//   - a key read under the lock of the same name is read from its stream's
//     leader, not by direct get (which the nearest replica answers, and a
//     follower may not yet have applied the write another holder made just
//     before it released the lock): what a read-modify-write acts on before
//     it writes back (a refresh token it redeems, a pending login it takes)
//     is the last value written.
//
// Every value, and every object, is sealed with AES-256-GCM under a key
// derived from the cluster key ([Derive]), with the bucket, the key and the
// entry's kind as additional data: a NATS user without the cluster key
// reads nothing and cannot make, move or alter a value this storage
// accepts ([ErrUnsealed]). It can still delete values or put back an older
// sealed value of the same key, which NATS permissions must prevent.
//
// Listings, Stat and Delete follow certmagic.FileStorage: a directory is a
// prefix of keys, List without recursion gives a prefix's children, and
// Delete removes a key and everything under it.
package cluster
