// A real OpenID provider for fleetd's sign-in tests: panva's oidc-provider (certified by the OpenID
// Foundation) with the authorization code flow (PKCE) and the device authorization grant on. Its
// accounts and their claims come from OIDC_ACCOUNTS (JSON: {login: {name, email, groups, uid,
// gid}}), read again on every sign-in from the file OIDC_ACCOUNTS_FILE when that is set, so that a
// test can change a user's groups between two refreshes. OIDC_REDIRECT_URIS (JSON) are the clients'
// redirect URIs, OIDC_CLIENT_AUTH their one token endpoint authentication method. It listens on 127.0.0.1:PORT and prints
// "listening <issuer>" once it does. Test-only: never shipped.
import fs from 'node:fs';
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const redirectUris = JSON.parse(process.env.OIDC_REDIRECT_URIS || '["http://127.0.0.1/cb"]');
// How clients authenticate at the token endpoint: the only method discovery lists.
const clientAuth = process.env.OIDC_CLIENT_AUTH || 'client_secret_basic';

function accounts() {
  const file = process.env.OIDC_ACCOUNTS_FILE;
  return JSON.parse(file ? fs.readFileSync(file, 'utf8') : (process.env.OIDC_ACCOUNTS || '{}'));
}

const configuration = {
  clients: [{
    client_id: 'fleetd',
    client_secret: process.env.OIDC_CLIENT_SECRET || 'fleetd-test-secret',
    redirect_uris: redirectUris,
    grant_types: ['authorization_code', 'refresh_token', 'urn:ietf:params:oauth:grant-type:device_code'],
    response_types: ['code'],
    token_endpoint_auth_method: clientAuth,
  }, {
    client_id: 'other-app',  // tokens for another audience: fleetd must refuse them
    client_secret: 'other-secret',
    redirect_uris: redirectUris,
    grant_types: ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code'],
    response_types: ['code'],
    token_endpoint_auth_method: clientAuth,
  }],
  clientAuthMethods: [clientAuth],
  features: {
    devInteractions: { enabled: true },  // a login form that takes any login: the account is the login
    deviceFlow: { enabled: true },
    revocation: { enabled: true },
  },
  pkce: { required: () => true },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email'],
    groups: ['groups', 'uid_number', 'gid_number'],
  },
  conformIdTokenClaims: false,  // the claims go into the ID token, as Okta, Entra ID and Keycloak can
  ttl: { AccessToken: 600, IdToken: 600, DeviceCode: 120, Session: 3600, Interaction: 600, Grant: 3600,
         RefreshToken: 3600 },
  cookies: { keys: ['fleetd-test-cookie-key'] },
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  // Every scope the client asks for is granted: no consent page in the tests.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid offline_access profile email groups');
    grant.addOIDCClaims(['sub', 'name', 'preferred_username', 'email', 'groups', 'uid_number', 'gid_number']);
    await grant.save();
    return grant;
  },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        const out = { sub: id, preferred_username: id, name: account.name || id };
        if (account.email) out.email = account.email;
        out.groups = accounts()[id]?.groups || [];
        if (account.uid !== undefined) out.uid_number = account.uid;
        if (account.gid !== undefined) out.gid_number = account.gid;
        return out;
      },
    };
  },
};

const provider = new Provider(issuer, configuration);
provider.on('grant.error', (ctx, err) => { console.log(`grant.error ${err.message}: ${err.error_detail || ''}`); });
provider.listen(port, '127.0.0.1', () => { console.log(`listening ${issuer}`); });
