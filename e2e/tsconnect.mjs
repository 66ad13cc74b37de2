// tsconnect.mjs: the TypeScript SDK client meeting a per_user upstream before its person has connected their
// account there, and following the URL elicitation as an application built on the SDK does (the SDK's own
// example client: catch UrlElicitationRequiredError, open the URL, wait for notifications/elicitation/complete,
// call again).
//
//   node tsconnect.mjs --url URL --token TOKEN --tool NAME
//
// It connects with the bearer TOKEN at the SDK's protocol version (2025-11-25), declaring URL elicitation, lists
// the tools and prints {"tools": N, "names": [...]}; calls NAME and, on the -32042 error, prints {"elicit": url, "id": elicitationId}
// (the Go test opens the URL in headless Chromium); waits at most two minutes for notifications/elicitation/complete
// of that id on the GET stream, calls NAME again on the same session and prints
// {"tool": text, "isError": bool, "listChanged": bool, "toolsAfter": N}. A failure prints {"error": message} and
// exits 2.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  UrlElicitationRequiredError, ElicitationCompleteNotificationSchema, ToolListChangedNotificationSchema, ElicitRequestSchema,
} from '@modelcontextprotocol/sdk/types.js';

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  if (i < 0 || i + 1 >= args.length) {
    process.stderr.write(`tsconnect: ${name} is required\n`);
    process.exit(64);
  }
  return args[i + 1];
};
const url = new URL(opt('--url'));
const token = opt('--token');
const tool = opt('--tool');
const say = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const text = (res) => (res.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');

async function main() {
  const client = new Client({ name: 'e2e-ts-connect', version: '1' }, { capabilities: { elicitation: { url: {} } } });
  const completed = new Map();
  let listChanged = false;
  client.setNotificationHandler(ElicitationCompleteNotificationSchema, (n) => {
    completed.get(n.params.elicitationId)?.();
    completed.set(n.params.elicitationId, null);
  });
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { listChanged = true; });
  // No server here asks a form question; one that did is declined.
  client.setRequestHandler(ElicitRequestSchema, () => ({ action: 'decline' }));
  const transport = new StreamableHTTPClientTransport(url, { requestInit: { headers: { Authorization: `Bearer ${token}` } } });
  // What the transport meets on its own (the GET stream's failures among them) goes to stderr, for the test's report.
  client.onerror = (e) => process.stderr.write(`tsconnect: transport: ${e?.message ?? e}\n`);
  await client.connect(transport);
  const listed = (await client.listTools()).tools;
  say({ tools: listed.length, names: listed.map((t) => t.name) });
  let elicitation;
  try {
    const res = await client.callTool({ name: tool, arguments: {} });
    throw new Error(`the first call was answered: ${JSON.stringify(res)}`);
  } catch (e) {
    if (!(e instanceof UrlElicitationRequiredError) || e.elicitations.length !== 1) throw e;
    elicitation = e.elicitations[0];
  }
  const done = new Promise((resolve, reject) => {
    if (completed.get(elicitation.elicitationId) === null) { resolve(); return; }
    completed.set(elicitation.elicitationId, resolve);
    // Not unref'd: with no GET stream open nothing else keeps Node running, and it would end with nothing said.
    setTimeout(() => reject(new Error('no notifications/elicitation/complete within 2 minutes')), 120_000);
  });
  say({ elicit: elicitation.url, id: elicitation.elicitationId });
  await done;
  const res = await client.callTool({ name: tool, arguments: {} });
  const after = (await client.listTools()).tools.length;
  say({ tool: text(res), isError: res.isError === true, listChanged, toolsAfter: after });
  await client.close();
  process.exit(0);
}

main().catch((e) => {
  say({ error: String(e?.message ?? e) });
  process.exit(2);
});
