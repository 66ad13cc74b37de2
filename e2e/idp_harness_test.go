package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// testIdP is panva's oidc-provider running as the company IdP, with the
// gateway registered as a confidential client.
type testIdP struct {
	Issuer       string
	ClientID     string
	ClientSecret string
}

// The people e2e/idp/provider.mjs knows: alice is in the eng group, bob in
// sales. Its development login takes any password.
const idpPassword = "any password"

// startIdP runs e2e/idp/provider.mjs under Node 22 on a free loopback port,
// with redirectURI as the client's one redirect URI, and waits until it
// serves its discovery document. The issuer is named http://localhost:PORT,
// so that the IdP and a site on 127.0.0.1 are different sites to a browser
// (SameSite cookies then behave as between a real IdP and a gateway).
func startIdP(t testing.TB, redirectURI string) *testIdP {
	t.Helper()
	port := freePort(t)
	idp := &testIdP{Issuer: fmt.Sprintf("http://localhost:%d", port), ClientID: "zidane-gateway", ClientSecret: randomHex(24)}
	cmd := exec.Command(node(t), filepath.Join(e2eDir, "idp", "provider.mjs"))
	cmd.Dir = e2eDir
	cmd.Env = append(nodeEnv(t), "IDP_PORT="+strconv.Itoa(port), "IDP_ISSUER="+idp.Issuer,
		"IDP_CLIENT_ID="+idp.ClientID, "IDP_CLIENT_SECRET="+idp.ClientSecret, "IDP_REDIRECT_URI="+redirectURI)
	p := startProcess(t, "oidc-provider", cmd, filepath.Join(t.TempDir(), "oidc-provider.log"))
	t.Cleanup(func() {
		p.stop(2 * time.Second)
		p.dumpIfFailed(t)
	})
	discovery := fmt.Sprintf("http://127.0.0.1:%d/.well-known/openid-configuration", port)
	deadline := time.Now().Add(startTimeout)
	for {
		if p.exited() {
			t.Fatalf("oidc-provider exited before it served:\n%s", tail(p.logs(), logDumpLimit))
		}
		if issuer, err := discoveryIssuer(discovery); err == nil {
			if issuer != idp.Issuer {
				t.Fatalf("oidc-provider names its issuer %q, not %q", issuer, idp.Issuer)
			}
			return idp
		}
		if time.Now().After(deadline) {
			t.Fatalf("oidc-provider served no discovery document within %s:\n%s", startTimeout, tail(p.logs(), logDumpLimit))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func discoveryIssuer(u string) (string, error) {
	resp, err := shortClient.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s", resp.Status)
	}
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(&doc); err != nil {
		return "", err
	}
	return doc.Issuer, nil
}

// browserSession is one headless Chromium (its own profile, so its own
// cookies) driven over the DevTools protocol.
type browserSession struct {
	ctx context.Context
}

// newBrowser starts headless Chromium ($ZIDANE_CHROMIUM, or chromium on
// PATH; the test is skipped without it, as TestSessionsLinkPage is). It
// resolves no name but localhost and loopback addresses, so that a page
// that asks for something on the Internet (oidc-provider's login page
// imports a web font) gets nothing and no test reaches past loopback.
func newBrowser(t *testing.T) *browserSession {
	t.Helper()
	bin := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"),
	)
	ctx, cancel := context.WithTimeout(context.Background(), chromiumTimeout)
	t.Cleanup(cancel)
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return &browserSession{ctx: bctx}
}

// browserStepTimeout bounds one do: a page that never shows what a step
// waits for fails the step, and the browser is still there to say where
// it is.
const browserStepTimeout = 30 * time.Second

// do runs steps in the browser, failing the test with where it is and what
// it shows when one fails.
func (b *browserSession) do(t testing.TB, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		loc, _ := chromedp.Run(b.ctx, chromedp.Location())
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("%s: %v\nat %s:\n%s", what, err, loc, tail(text, 2000))
	}
}

// page is where the browser is and the text it shows.
func (b *browserSession) page(t testing.TB) (location, text string) {
	t.Helper()
	location, err := chromedp.Run(b.ctx, chromedp.Location())
	if err == nil {
		text, err = chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
	}
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	return location, text
}

// idpLogin signs login in at oidc-provider's development pages, the
// browser being on (or on its way to) its login page: the login form,
// then the consent form. It returns once the consent is sent, the browser
// on its way back to the client (a gateway's callback).
func (b *browserSession) idpLogin(t testing.TB, login string) {
	t.Helper()
	b.do(t, "signing in at the IdP as "+login,
		chromedp.WaitVisible(chromedp.CSS(`input[name="login"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="login"]`), login),
		chromedp.SendKeys(chromedp.CSS(`input[name="password"]`), idpPassword),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS(`input[name="prompt"][value="consent"]`)),
	)
	b.do(t, "consenting at the IdP",
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`input[name="prompt"][value="consent"]`)),
	)
}

// idpSignIn opens startURL (a page that sends the browser to sign in),
// signs login in at the IdP, and returns the location and the text of the
// page the browser ends on: one of the gateway's, whose heading has the
// id "title".
func (b *browserSession) idpSignIn(t testing.TB, startURL, login string) (location, text string) {
	t.Helper()
	b.do(t, "opening "+startURL, chromedp.Navigate(startURL))
	b.idpLogin(t, login)
	b.do(t, "coming back from the IdP", chromedp.WaitReady(chromedp.ID("title")))
	return b.page(t)
}
