// tsclient.mjs: an MCP client on the TypeScript SDK, driven by the Go end-to-end tests.
//
//   node tsclient.mjs --url URL [--token T] [--origin O] [--header 'K: V']... COMMAND [ARGS]
//
//   list-tools        print a JSON array of the tool names (all pages)
//   call TOOL [JSON]  call TOOL with the JSON object of arguments; print the CallToolResult as JSON
//   session           hold one session open; read one JSON request per stdin line and answer each
//                     with one line {"result": …} or a failure line:
//                       {"op":"list-tools"}  {"op":"call","name":T,"arguments":{…}}
//                       {"op":"set-level","level":"debug"}  {"op":"session-id"}
//                     It first prints {"ready":true,"sessionId":…}, prints each server notification
//                     as {"notification":{…}} when it arrives, and closes the session at stdin's end.
//
// When the SDK gives up it prints one line {"error": message, "status": HTTP status, "rpcCode":
// JSON-RPC code} (status and rpcCode when known) and exits 2. A usage error exits 64.
import readline from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

function usage(message) {
  process.stderr.write(`tsclient: ${message}\nusage: node tsclient.mjs --url URL [--token T] [--origin O] [--header 'K: V'] list-tools | call TOOL [JSON] | session\n`);
  process.exit(64);
}

function parseArgs(argv) {
  const opts = { headers: {}, positional: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (!arg.startsWith('--')) {
      opts.positional.push(arg);
      continue;
    }
    const value = argv[++i];
    if (value === undefined) usage(`${arg} needs a value`);
    if (arg === '--url') opts.url = value;
    else if (arg === '--token') opts.headers.Authorization = `Bearer ${value}`;
    else if (arg === '--origin') opts.headers.Origin = value;
    else if (arg === '--header') {
      const colon = value.indexOf(':');
      if (colon < 1) usage(`--header wants 'Name: value', got ${JSON.stringify(value)}`);
      opts.headers[value.slice(0, colon).trim()] = value.slice(colon + 1).trim();
    } else usage(`unknown flag ${arg}`);
  }
  if (!opts.url) usage('--url is required');
  if (opts.positional.length === 0) usage('a command is required');
  return opts;
}

function print(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}

// failure describes err as the Go tests read it (tsFailure in harness_test.go).
function failure(err) {
  let message = err instanceof Error ? err.message : String(err);
  if (err?.cause?.message) message += `: ${err.cause.message}`;
  const out = { error: message };
  if (err instanceof StreamableHTTPError && err.code > 0) out.status = err.code;
  if (err instanceof McpError) out.rpcCode = err.code;
  return out;
}

async function toolNames(client) {
  const names = [];
  let cursor;
  do {
    const page = await client.listTools(cursor ? { cursor } : {});
    names.push(...page.tools.map((tool) => tool.name));
    cursor = page.nextCursor;
  } while (cursor);
  return names;
}

function parseJSONObject(text, what) {
  try {
    const value = JSON.parse(text);
    if (value && typeof value === 'object' && !Array.isArray(value)) return value;
  } catch {}
  usage(`${what} must be a JSON object, got ${JSON.stringify(text)}`);
}

async function answer(client, transport, request) {
  switch (request.op) {
    case 'list-tools':
      return toolNames(client);
    case 'call':
      return client.callTool({ name: request.name, arguments: request.arguments ?? {} });
    case 'set-level':
      return client.setLoggingLevel(request.level);
    case 'session-id':
      return transport.sessionId ?? null;
    default:
      throw new Error(`unknown op ${JSON.stringify(request.op)}`);
  }
}

async function session(client, transport) {
  client.fallbackNotificationHandler = async (notification) => print({ notification });
  print({ ready: true, sessionId: transport.sessionId ?? null });
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (line.trim() === '') continue;
    try {
      print({ result: (await answer(client, transport, JSON.parse(line))) ?? null });
    } catch (err) {
      print(failure(err));
    }
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const [command, ...args] = opts.positional;
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    requestInit: { headers: opts.headers },
  });
  const client = new Client({ name: 'zidane-e2e-tsclient', version: '1.0.0' });
  try {
    await client.connect(transport);
    switch (command) {
      case 'list-tools':
        print(await toolNames(client));
        break;
      case 'call':
        if (!args[0]) usage('call needs a tool name');
        print(await client.callTool({ name: args[0], arguments: args[1] ? parseJSONObject(args[1], 'JSONARGS') : {} }));
        break;
      case 'session':
        await session(client, transport);
        break;
      default:
        usage(`unknown command ${command}`);
    }
  } catch (err) {
    print(failure(err));
    process.exit(2);
  }
  await client.close().catch(() => {});
  process.exit(0);
}

await main();
