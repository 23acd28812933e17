// The OpenID Provider of the SSO tests: panva's oidc-provider (OpenID Certified), so that
// Quor's client meets a real OP rather than our own reading of the spec. Started by
// tests/oidc_provider/__init__.py as `node server.mjs <config.json>`; see that module for
// the configuration's fields.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import { Provider } from 'oidc-provider';

const readJson = (path) => JSON.parse(readFileSync(path, 'utf8'));
const config = readJson(process.argv[2]);
const tenMinutes = 600;

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: readJson(config.jwks_file),
  // Read on every lookup: a test changes an account's claims between two logins. A code
  // redeemed after its account went is invalid_grant; a login without an account fails
  // the sign-in with a 500 (OpenIdProvider.authorize refuses to submit one).
  async findAccount(ctx, accountId) {
    const claims = readJson(config.accounts_file)[accountId];
    if (!claims) return undefined;
    return { accountId, claims: async () => ({ ...claims, sub: accountId }) };
  },
  // Scope -> the claims it releases. quor_role comes with `profile` and with a scope of
  // its own, whichever a client asks for.
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'quor_role'],
    groups: ['groups'],
    quor_role: ['quor_role'],
  },
  // By default an ID token issued together with an access token carries only `sub` (the
  // rest is at userinfo); Quor reads email, groups and quor_role from the ID token.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  // Its outgoing requests refuse special-use addresses (SSRF protection); Quor's
  // back-channel logout URL is on loopback in the tests.
  fetch: (url, { dispatcher, ...options }) => globalThis.fetch(url, options),
  features: {
    // The default in v9, explicit because the tests drive its login and consent forms.
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    // The OP tells Quor (the client's backchannel_logout_uri) when a session ends.
    backchannelLogout: { enabled: true },
    userinfo: { enabled: true },
  },
  ttl: {
    AccessToken: tenMinutes,
    AuthorizationCode: tenMinutes,
    IdToken: tenMinutes,
    Interaction: tenMinutes,
    Session: tenMinutes,
    Grant: tenMinutes,
  },
});

// A test that fails at the OP shows why in the OP's log.
for (const event of [
  'server_error',
  'authorization.error',
  'grant.error',
  'userinfo.error',
  'end_session.error',
  'jwks.error',
  'discovery.error',
  'backchannel.error',
]) {
  provider.on(event, (ctx, error) => {
    console.error(`${event}: ${error.message}${error.error_description ? ` (${error.error_description})` : ''}${error.cause ? ` (${error.cause})` : ''}`);
  });
}

createServer(provider.callback())
  .on('error', (error) => {
    console.error(error);
    process.exit(1);
  })
  .listen(config.port, '127.0.0.1', () => console.log('ready'));
