// The company IdP of the sign-in tests: panva's oidc-provider (OpenID
// Certified), on loopback, with one confidential client (the gateway) and
// two people. Its development interactions give the login and consent
// pages a headless browser fills in: any password is accepted for a
// known login.
//
// Environment: IDP_PORT, IDP_ISSUER (http://localhost:PORT or
// http://127.0.0.1:PORT), IDP_CLIENT_ID, IDP_CLIENT_SECRET,
// IDP_REDIRECT_URI. It prints "listening" once it serves.
import http from 'node:http';
import crypto from 'node:crypto';
import Provider from 'oidc-provider';

const env = (name) => {
  const v = process.env[name];
  if (!v) {
    console.error(`provider.mjs: set ${name}`);
    process.exit(2);
  }
  return v;
};

const port = Number(env('IDP_PORT'));
const issuer = env('IDP_ISSUER');

// The people: alice is in eng, bob in sales only. Their claims are what
// the gateway's rules read.
const people = {
  alice: { sub: 'alice', name: 'Alice Example', email: 'alice@example.com', email_verified: true, groups: ['eng', 'staff'] },
  bob: { sub: 'bob', name: 'Bob Example', email: 'bob@example.com', email_verified: true, groups: ['sales'] },
};

const provider = new Provider(issuer, {
  clients: [{
    client_id: env('IDP_CLIENT_ID'),
    client_secret: env('IDP_CLIENT_SECRET'),
    redirect_uris: [env('IDP_REDIRECT_URI')],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: { openid: ['sub'], profile: ['name'], email: ['email', 'email_verified'], groups: ['groups'] },
  // Claims of the granted scopes go in the ID token itself, where the
  // gateway reads them (the default keeps them for userinfo alone).
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true } },
  pkce: { required: () => true },
  cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  async findAccount(ctx, id) {
    const person = people[id];
    if (!person) return undefined;
    return { accountId: id, claims: async () => ({ ...person }) };
  },
});

// Every exchange is printed (never a secret: the client's secret and the
// codes are not in these events), so a failed test shows what the IdP saw.
for (const ev of ['grant.success', 'grant.error', 'authorization.error', 'server_error']) {
  provider.on(ev, (ctx, err) => console.log(ev, err ? `${err.name}: ${err.message}` : ''));
}

const server = http.createServer(provider.callback());
server.listen(port, '127.0.0.1', () => console.log('listening'));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close(() => process.exit(0)));
