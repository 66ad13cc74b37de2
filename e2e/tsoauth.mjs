// tsoauth.mjs: the TypeScript SDK client signing in through an MCP server's authorization server, driven
// by the Go end-to-end tests, which play the person's browser.
//
//   node tsoauth.mjs --url URL --redirect REDIRECT_URI
//
// It connects to URL with an OAuthClientProvider that registers dynamically (client_name "e2e ts client").
// When the SDK sends the person to authorize, it prints {"authorize": URL} and reads one stdin line: the URL
// the browser was sent back to. It then finishes the authorization, connects again with the tokens, and
// prints {"tools": [names], "token_type": T, "scope": S}. A failure prints {"error": message} and exits 2.
import readline from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  if (i < 0 || i + 1 >= args.length) {
    process.stderr.write(`tsoauth: ${name} is required\n`);
    process.exit(64);
  }
  return args[i + 1];
};
const url = new URL(opt('--url'));
const redirect = opt('--redirect');

const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

class Provider {
  constructor() {
    this.client = undefined;
    this.saved = undefined;
    this.verifier = undefined;
  }
  get redirectUrl() { return redirect; }
  get clientMetadata() {
    return {
      client_name: 'e2e ts client',
      redirect_uris: [redirect],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }
  clientInformation() { return this.client; }
  saveClientInformation(info) { this.client = info; }
  tokens() { return this.saved; }
  saveTokens(tokens) { this.saved = tokens; }
  redirectToAuthorization(authorizationUrl) {
    process.stdout.write(JSON.stringify({ authorize: authorizationUrl.toString() }) + '\n');
  }
  saveCodeVerifier(v) { this.verifier = v; }
  codeVerifier() { return this.verifier; }
}

async function main() {
  const provider = new Provider();
  const client = new Client({ name: 'e2e-ts-oauth', version: '1' });
  let transport = new StreamableHTTPClientTransport(url, { authProvider: provider });
  try {
    await client.connect(transport);
  } catch (e) {
    if (!(e instanceof UnauthorizedError)) throw e;
    const next = await lines.next();
    if (next.done) throw new Error('no callback URL on stdin');
    const back = new URL(next.value.trim());
    if (back.searchParams.get('error')) throw new Error(`authorization refused: ${back.searchParams.get('error')}`);
    await transport.finishAuth(back.searchParams.get('code'));
    transport = new StreamableHTTPClientTransport(url, { authProvider: provider });
    await client.connect(transport);
  }
  const { tools } = await client.listTools();
  process.stdout.write(JSON.stringify({ tools: tools.map((t) => t.name), token_type: provider.saved?.token_type, scope: provider.saved?.scope }) + '\n');
  await client.close();
  process.exit(0);
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ error: String(e?.message ?? e) }) + '\n');
  process.exit(2);
});
