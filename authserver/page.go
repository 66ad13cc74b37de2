package authserver

import (
	"bytes"
	"html/template"
	"net/http"
	"strconv"

	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
)

// pageCSP: nothing loads but the inline style, nothing frames a page (the
// consent form must not be clickjacked).
var pageCSP = htmlpage.MustCSP("style-src 'unsafe-inline'", "base-uri 'none'", "frame-ancestors 'none'")

// pageHeaders are on every page this server shows: those of
// htmlpage.SetHeaders, and Pragma for HTTP/1.0 caches (a page carries a
// CSRF token and a sealed request). No referrer goes off this origin:
// the authorization request's URL, with its state, must not follow a link
// or the redirect to the client. The consent page, whose form posts back
// here, says same-origin (htmlpage.SameOrigin says why); the others say
// no-referrer.
func pageHeaders(h http.Header, consent bool) {
	ref := htmlpage.NoReferrer
	if consent {
		ref = htmlpage.SameOrigin
	}
	htmlpage.SetHeaders(h, pageCSP, ref)
	h.Set("Pragma", "no-cache")
}

type consentPage struct {
	Issuer, Action       string
	ClientID, ClientName string
	RedirectHost         string
	Loopback             bool
	Resource             string
	Scopes, NotOffered   []string
	Person, Owner        string
	Request, CSRF        string
}

type errorPage struct {
	Status int
	Title  string
	Reason string
}

const style = `<style>body{font-family:system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em;line-height:1.5}
code{word-break:break-all}.claim{color:#555}.warn{background:#fff4d6;padding:.5em}button{margin-right:1em;padding:.4em 1.2em}</style>`

var pages = template.Must(template.New("consent").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Allow access?</title>` + style + `</head><body>
<h1>Allow access?</h1>
<p>You are signed in as <strong>{{.Person}}</strong> (<code>{{.Owner}}</code>).</p>
<p>A client asks for access to <code>{{.Resource}}</code> on your behalf.</p>
<dl>
<dt>Client</dt><dd><code>{{.ClientID}}</code>{{if .ClientName}} <span class="claim">(it calls itself “{{.ClientName}}”; the name is the client's own claim)</span>{{end}}</dd>
<dt>It will receive the grant at</dt><dd><code>{{.RedirectHost}}</code></dd>
</dl>
{{if .Loopback}}<p class="warn">This client receives the grant on your own computer ({{.RedirectHost}}). Allow only if you started this sign-in from an application on this computer just now.</p>{{end}}
<form method="post" action="{{.Action}}">
<fieldset><legend>Scopes it may use (untick to narrow)</legend>
{{range .Scopes}}<label><input type="checkbox" name="scope" value="{{.}}" checked> <code>{{.}}</code></label><br>
{{end}}</fieldset>
{{if .NotOffered}}<p>It also asked for scopes you may not grant, which it will not get: {{range .NotOffered}}<code>{{.}}</code> {{end}}</p>{{end}}
<input type="hidden" name="client_id" value="{{.ClientID}}">
<input type="hidden" name="request" value="{{.Request}}">
<input type="hidden" name="csrf" value="{{.CSRF}}">
<p><button type="submit" name="decision" value="allow">Allow</button><button type="submit" name="decision" value="deny">Deny</button></p>
</form>
<p class="claim">Authorization server {{.Issuer}}</p>
</body></html>`))

func init() {
	template.Must(pages.New("error").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>` + style + `</head><body>
<h1>{{.Title}}</h1>
<p>{{.Reason}}</p>
<p class="claim">Nothing was sent back to the application. Close this page and start again from the application.</p>
</body></html>`))
}

// page renders a page: whole, or not at all.
func (s *Server) page(w http.ResponseWriter, status int, data any) {
	name := "consent"
	if _, ok := data.(errorPage); ok {
		name = "error"
	}
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, data); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString("the page could not be rendered")
	}
	pageHeaders(w.Header(), name == "consent")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// refusePage audits ref and shows it to the person: a refusal that
// cannot go back to a client, because no redirect URI was found good.
func (s *Server) refusePage(w http.ResponseWriter, r *http.Request, status int, ref Refusal) {
	s.audit(r, ref)
	s.page(w, status, errorPage{Status: status, Title: "This sign-in cannot go on", Reason: ref.Reason})
}
