package e2e

import (
	"bytes"
	"context"
	"html"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chromiumTimeout bounds one headless Chromium run.
const chromiumTimeout = 90 * time.Second

// chromium returns the Chromium binary: $ZIDANE_CHROMIUM (./test.sh sets it
// when Chromium is installed; it must then exist), or `chromium` on PATH.
// Without either the test is skipped: ./test.sh installs Debian's chromium
// package only when it runs as root.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ZIDANE_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("ZIDANE_CHROMIUM=%s: %v", p, err)
		}
		return p
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed, so the session page is not checked in a browser; ./test.sh installs it (apt-get install chromium) when it runs as root")
	}
	return p
}

// headless runs Chromium headless on pageURL with more flags (--dump-dom,
// --screenshot=…) and returns its stdout.
func headless(t *testing.T, bin, pageURL string, flags ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), chromiumTimeout)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}, flags...)
	cmd := boundedCommand(ctx, bin, append(args, pageURL)...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+cmd.Dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(flags, " "), err, tail(stderr.String(), 4000))
	}
	return stdout.String()
}

// page is a session page as Chromium rendered it.
type page struct {
	dom string
}

func (p page) title() string {
	m := regexp.MustCompile(`(?s)<title>(.*?)</title>`).FindStringSubmatch(p.dom)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// byID returns the text inside the element with id.
func (p page) byID(id string) string {
	m := regexp.MustCompile(`(?s)<(\w+)[^>]*\bid="` + regexp.QuoteMeta(id) + `"[^>]*>(.*?)</(\w+)>`).FindStringSubmatch(p.dom)
	if m == nil {
		return ""
	}
	return visibleText(m[2])
}

// text is what a person reads on the page: the body without tags, styles
// or scripts, entities decoded, whitespace collapsed.
func (p page) text() string {
	body := p.dom
	if i := strings.Index(body, "<body"); i >= 0 {
		body = body[i:]
	}
	return visibleText(body)
}

var (
	hiddenElements = regexp.MustCompile(`(?s)<(style|script|head)\b.*?</(style|script|head)>`)
	anyTag         = regexp.MustCompile(`<[^>]*>`)
	spaces         = regexp.MustCompile(`\s+`)
)

func visibleText(s string) string {
	s = hiddenElements.ReplaceAllString(s, " ")
	s = anyTag.ReplaceAllString(s, " ")
	return strings.TrimSpace(spaces.ReplaceAllString(html.UnescapeString(s), " "))
}

// TestSessionsLinkPage opens a session's link in headless Chromium and
// checks what a person sees: the title, the state, the transcript and a
// pending interaction; that the page renders to an image; and that a link
// opens only its own session.
func TestSessionsLinkPage(t *testing.T) {
	bin := chromium(t)
	gw := startSessionsGateway(t, "", "")
	token := createToken(t, gw.c, "browser", "--scope", "chat")
	g := connectGoSessions(t, gw.url, token, "go-sdk")
	dir := t.TempDir()

	a := createSession(t, g, dir, "approve: deploy the site")
	settleIn(t, g, a.SessionID, "blocked")
	it := onlyPending(t, g, a.SessionID)
	b := createSession(t, g, dir, "hello from session B")
	settleIn(t, g, b.SessionID, "idle")

	t.Run("a pending interaction is shown while the session is blocked", func(t *testing.T) {
		p := page{headless(t, bin, a.Link, "--dump-dom")}
		if want := "approve: deploy the site · session " + a.SessionID; p.title() != want {
			t.Errorf("title = %q, want %q", p.title(), want)
		}
		if got := p.byID("title"); got != "approve: deploy the site" {
			t.Errorf("heading = %q", got)
		}
		if got := p.byID("state"); got != "blocked" {
			t.Errorf("state = %q, want blocked", got)
		}
		text := p.text()
		for _, want := range []string{
			"Waiting for an answer",
			"approval : Approval: execute deploy the site",
			it.RequestID,
			"Transcript",
			"approve: deploy the site",
			"agent demo",
			dir,
		} {
			if !strings.Contains(text, want) {
				t.Errorf("the page does not show %q:\n%s", want, text)
			}
		}
		if strings.Contains(text, "hello from session B") {
			t.Errorf("session A's page shows session B's transcript")
		}
	})

	if r := answerInteraction(t, g, it.RequestID, map[string]any{"decision": "allow"}); r.IsError {
		t.Fatalf("answer: %s", r.Text)
	}
	settleIn(t, g, a.SessionID, "idle")

	t.Run("after the answer the page shows the idle session and its answer", func(t *testing.T) {
		p := page{headless(t, bin, a.Link, "--dump-dom")}
		if got := p.byID("state"); got != "idle" {
			t.Errorf("state = %q, want idle", got)
		}
		text := p.text()
		for _, want := range []string{"Nothing is waiting.", "approve: deploy the site", "Allowed: deploy the site", "end_turn", "1 turn"} {
			if !strings.Contains(text, want) {
				t.Errorf("the page does not show %q:\n%s", want, text)
			}
		}
		if strings.Contains(text, it.RequestID) {
			t.Errorf("the answered interaction is still shown:\n%s", text)
		}
	})

	t.Run("the page renders to a PNG screenshot", func(t *testing.T) {
		shot := filepath.Join(t.TempDir(), "session.png")
		headless(t, bin, a.Link, "--screenshot="+shot, "--window-size=1200,900", "--hide-scrollbars")
		raw, err := os.ReadFile(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("the screenshot (%d bytes) is not a PNG: %v", len(raw), err)
		}
		if bounds := img.Bounds(); bounds.Dx() != 1200 || bounds.Dy() != 900 {
			t.Errorf("screenshot is %v, want 1200x900", bounds)
		}
		// A blank page would be one colour: count a few distinct ones.
		colours := map[[4]uint32]bool{}
		for y := 0; y < 900 && len(colours) < 3; y += 7 {
			for x := 0; x < 1200 && len(colours) < 3; x += 7 {
				r, g, b, a := img.At(x, y).RGBA()
				colours[[4]uint32{r, g, b, a}] = true
			}
		}
		if len(colours) < 3 {
			t.Errorf("the screenshot looks blank (%d colours)", len(colours))
		}
	})

	withCap := func(link, sessionID, capability string) string {
		u, err := url.Parse(link)
		if err != nil {
			t.Fatal(err)
		}
		if sessionID != "" {
			u.Path = "/zidane/session/" + sessionID
		}
		if capability != "" {
			q := u.Query()
			q.Set("cap", capability)
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	capOf := func(link string) string {
		u, err := url.Parse(link)
		if err != nil {
			t.Fatal(err)
		}
		return u.Query().Get("cap")
	}
	status := func(t *testing.T, link string) int {
		resp, err := shortClient.Get(link)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	for _, tc := range []struct {
		name, link, reason string
	}{
		{"a tampered capability is refused", withCap(a.Link, "", tamper(capOf(a.Link))), "not issued by this gateway"},
		{"a link for session A does not open session B", withCap(a.Link, b.SessionID, ""), "belongs to another session"},
		{"a link without its capability is refused", strings.SplitN(a.Link, "?", 2)[0], "it has no capability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status(t, tc.link); got != http.StatusForbidden {
				t.Errorf("GET %s: %d, want 403", tc.link, got)
			}
			text := page{headless(t, bin, tc.link, "--dump-dom")}.text()
			if !strings.Contains(text, "this session link is not valid") || !strings.Contains(text, tc.reason) {
				t.Errorf("the browser shows %q, want the refusal saying %q", text, tc.reason)
			}
			for _, secret := range []string{"hello from session B", "deploy the site", "Transcript"} {
				if strings.Contains(text, secret) {
					t.Errorf("the refused page shows %q", secret)
				}
			}
		})
	}

	t.Run("session B's own link opens session B", func(t *testing.T) {
		p := page{headless(t, bin, b.Link, "--dump-dom")}
		if p.byID("title") != "hello from session B" || !strings.Contains(p.text(), "You said: hello from session B") {
			t.Errorf("session B's page:\n%s", p.text())
		}
	})
}

// tamper changes one character in the middle of the capability's
// signature.
func tamper(capability string) string {
	i := strings.LastIndexByte(capability, '.') + 5
	c := byte('A')
	if capability[i] == 'A' {
		c = 'B'
	}
	return capability[:i] + string(c) + capability[i+1:]
}
