// tsbrowser.mjs: the TypeScript SDK client signing in through an MCP server's authorization server as a
// native app does: it serves its own loopback redirect URI, and a browser (headless Chromium, driven by the
// Go end-to-end tests) brings the authorization response to it.
//
//   node tsbrowser.mjs --url URL --issuer ISSUER --tool NAME
//
// It listens on 127.0.0.1 (a free port) for /callback, connects to URL with an OAuthClientProvider that
// registers dynamically (client_name "e2e ts browser client") and, when the SDK sends the person to
// authorize, prints {"authorize": URL}. The callback must carry the state it sent and iss equal to ISSUER
// (RFC 9207, which this SDK leaves to the application); it then redeems the code, calls the tool NAME, waits
// until the access token has expired, calls it again (the SDK refreshes on the 401), and prints
// {"tool": text, "again": text, "token_type": T, "scope": S, "refreshed": bool}. A failure prints
// {"error": message} and exits 2.
import http from 'node:http';
import crypto from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  if (i < 0 || i + 1 >= args.length) {
    process.stderr.write(`tsbrowser: ${name} is required\n`);
    process.exit(64);
  }
  return args[i + 1];
};
const url = new URL(opt('--url'));
const issuer = opt('--issuer');
const tool = opt('--tool');

// The loopback redirect URI (RFC 8252): one authorization response, then closed.
let deliver;
const callback = new Promise((resolve) => { deliver = resolve; });
const server = http.createServer((req, res) => {
  const u = new URL(req.url, 'http://127.0.0.1');
  if (u.pathname !== '/callback') {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { 'Content-Type': 'text/html' });
  res.end('<!DOCTYPE html><title>done</title><h1 id="done">You may close this page.</h1>');
  deliver(u.searchParams);
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const redirect = `http://127.0.0.1:${server.address().port}/callback`;

class Provider {
  constructor() {
    this.client = undefined;
    this.saved = undefined;
    this.verifier = undefined;
    this.sentState = crypto.randomBytes(16).toString('base64url');
    this.saves = 0;
  }
  get redirectUrl() { return redirect; }
  get clientMetadata() {
    return {
      client_name: 'e2e ts browser client',
      redirect_uris: [redirect],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }
  state() { return this.sentState; }
  clientInformation() { return this.client; }
  saveClientInformation(info) { this.client = info; }
  tokens() { return this.saved; }
  saveTokens(tokens) { this.saved = tokens; this.saves++; }
  redirectToAuthorization(authorizationUrl) {
    process.stdout.write(JSON.stringify({ authorize: authorizationUrl.toString() }) + '\n');
  }
  saveCodeVerifier(v) { this.verifier = v; }
  codeVerifier() { return this.verifier; }
}

const text = (res) => (res.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');

async function main() {
  const provider = new Provider();
  const client = new Client({ name: 'e2e-ts-browser', version: '1' });
  let transport = new StreamableHTTPClientTransport(url, { authProvider: provider });
  try {
    await client.connect(transport);
  } catch (e) {
    if (!(e instanceof UnauthorizedError)) throw e;
    const q = await callback;
    if (q.get('error')) throw new Error(`authorization refused: ${q.get('error')}: ${q.get('error_description')}`);
    if (q.get('state') !== provider.sentState) throw new Error('the authorization response carries another state');
    if (q.get('iss') !== issuer) throw new Error(`the authorization response's iss is ${q.get('iss')}, not ${issuer}`);
    await transport.finishAuth(q.get('code'));
    transport = new StreamableHTTPClientTransport(url, { authProvider: provider });
    await client.connect(transport);
  }
  server.close();
  const first = text(await client.callTool({ name: tool, arguments: {} }));
  const { refresh_token: firstRefresh, expires_in: expiresIn, token_type: tokenType, scope } = provider.saved;
  // Wait the access token out; the next call is answered 401 and the SDK refreshes.
  await new Promise((resolve) => setTimeout(resolve, (expiresIn + 1) * 1000));
  const again = text(await client.callTool({ name: tool, arguments: {} }));
  process.stdout.write(JSON.stringify({
    tool: first, again, token_type: tokenType, scope,
    refreshed: provider.saves > 1 && provider.saved.refresh_token !== firstRefresh,
  }) + '\n');
  await client.close();
  process.exit(0);
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ error: String(e?.message ?? e) }) + '\n');
  process.exit(2);
});
