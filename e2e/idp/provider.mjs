// The company IdP of the sign-in tests: panva's oidc-provider (OpenID
// Certified), on loopback, with one confidential client (the gateway) and
// two people. Its development interactions give the login and consent
// pages a headless browser fills in: any password is accepted for a
// known login.
//
// It also plays the IdP of Enterprise-Managed Authorization (SEP-990):
// its client trades an ID token it issued, at its token endpoint (RFC 8693
// token exchange), for an ID-JAG naming the audience and resource asked
// for, signed with a key it publishes at its jwks_uri.
//
// Environment: IDP_PORT, IDP_ISSUER (http://localhost:PORT or
// http://127.0.0.1:PORT), IDP_CLIENT_ID, IDP_CLIENT_SECRET,
// IDP_REDIRECT_URI. It prints "listening" once it serves.
import http from 'node:http';
import crypto from 'node:crypto';
import Provider from 'oidc-provider';
import { SignJWT, exportJWK, generateKeyPair, importJWK } from 'jose';

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

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ID_TOKEN = 'urn:ietf:params:oauth:token-type:id_token';
const ID_JAG = 'urn:ietf:params:oauth:token-type:id-jag';

// The provider's keys: RS256 for its ID tokens, ES256 for the ID-JAGs,
// both published at its jwks_uri.
const jwk = async (alg) => {
  const { privateKey } = await generateKeyPair(alg, { extractable: true });
  return { ...(await exportJWK(privateKey)), alg, use: 'sig', kid: `${alg}-${crypto.randomUUID()}` };
};
const idTokenKey = await jwk('RS256');
const jagJWK = await jwk('ES256');
const jagKey = await importJWK(jagJWK, 'ES256');

const provider = new Provider(issuer, {
  clients: [{
    client_id: env('IDP_CLIENT_ID'),
    client_secret: env('IDP_CLIENT_SECRET'),
    redirect_uris: [env('IDP_REDIRECT_URI')],
    response_types: ['code'],
    grant_types: ['authorization_code', TOKEN_EXCHANGE],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: { keys: [idTokenKey, jagJWK] },
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

// The IdP side of SEP-990: an ID token this provider issued to the client
// (signature, issuer, audience, subject, unexpired) for an ID-JAG of five
// minutes naming the audience (the resource's authorization server) and
// the resource the client asks for.
provider.registerGrantType(TOKEN_EXCHANGE, async (ctx) => {
  const { params, client } = ctx.oidc;
  const fail = (error, description) => {
    ctx.status = 400;
    ctx.body = { error, error_description: description };
  };
  if (params.requested_token_type !== ID_JAG) return fail('invalid_request', 'requested_token_type must be an ID-JAG');
  if (params.subject_token_type !== ID_TOKEN) return fail('invalid_request', 'subject_token_type must be an ID token');
  if (!params.audience || !params.resource) return fail('invalid_request', 'audience and resource are required');
  let payload;
  try {
    ({ payload } = await provider.IdToken.validate(params.subject_token, client));
  } catch (err) {
    return fail('invalid_grant', `subject_token: ${err.message}`);
  }
  const now = Math.floor(Date.now() / 1000);
  if (!payload.exp || payload.exp <= now) return fail('invalid_grant', 'subject_token expired');
  const claims = { sub: payload.sub, resource: params.resource, client_id: client.clientId, jti: crypto.randomUUID() };
  if (params.scope) claims.scope = params.scope;
  const jag = await new SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', kid: jagJWK.kid, typ: 'oauth-id-jag+jwt' })
    .setIssuer(issuer).setAudience(params.audience).setIssuedAt(now).setExpirationTime(now + 300)
    .sign(jagKey);
  console.log('id-jag issued', payload.sub);
  ctx.body = { access_token: jag, issued_token_type: ID_JAG, token_type: 'N_A', expires_in: 300 };
}, ['subject_token', 'subject_token_type', 'requested_token_type', 'audience', 'resource', 'scope']);

// Every exchange is printed (never a secret: the client's secret and the
// codes are not in these events), so a failed test shows what the IdP saw.
for (const ev of ['grant.success', 'grant.error', 'authorization.error', 'server_error']) {
  provider.on(ev, (ctx, err) => console.log(ev, err ? `${err.name}: ${err.message}` : ''));
}

const server = http.createServer(provider.callback());
server.listen(port, '127.0.0.1', () => console.log('listening'));
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close(() => process.exit(0)));
