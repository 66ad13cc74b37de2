// Package acpclient is the client side of the Agent Client Protocol (ACP):
// it launches one coding-agent process, speaks JSON-RPC with it over stdio
// through github.com/coder/acp-go-sdk, and reports how and why the process
// ended.
//
// What it owns:
//   - the process: its own process group (so stopping it also stops what it
//     spawned), a minimal environment (see Env), the user it runs as when
//     it is given one, a bounded ring of its last
//     stderr lines, and a bounded stop (stdin closed, then SIGTERM, then
//     SIGKILL to the group);
//   - the wire: every line the agent writes to stdout must be a JSON-RPC 2.0
//     message; the first line that is not ends the agent with a protocol
//     error instead of being skipped silently, as the SDK would;
//   - the client-side ACP methods: fs/read_text_file and fs/write_text_file
//     confined to the agent's working directory (through os.Root, so symlinks
//     cannot escape it), elicitation in form mode, and permission requests.
//     Terminals are not supported: they are not advertised, and terminal/*
//     calls get a JSON-RPC "method not found" error.
//
// What it never does: decide anything about an answer. Permission requests,
// questions and session updates go to the Handler that the session engine
// provides. It also never keeps more than one ACP session per process: the
// SDK's elicitation/create carries no sessionId, so the engine runs one
// process per session and every question belongs to it.
package acpclient
