// Package accounts serves the page where a person signed in to the gateway
// sees the upstream accounts they connected (upstreams whose credentials
// are per_user) and disconnects them.
//
// It acts on the signed-in person's own connections alone: who a browser
// is signed in as comes from the sign-in (authserver/idp), never from the
// request. A disconnection is a form POST that must come from the sign-in
// site's own origin (Origin or Sec-Fetch-Site, as configured, never the
// Host) and carry a token bound to the person; the tokens at the upstream's
// authorization server are revoked (RFC 7009, where it can) and deleted.
// It never shows a token. How an account gets connected is the connect
// page's part, not this package's.
package accounts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/broker/upstreamauth"
	"github.com/Tahul/caddy-zidane-mcp/internal/formpost"
	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
)

// Path is where the page is served, under the sign-in's prefix.
const Path = "/zidane/signin/accounts"

// Person is who a browser is signed in as.
type Person struct {
	// Owner is the person's owner id (see policy.Principal.Owner).
	Owner string
	// Name is what the page calls them; it decides nothing.
	Name string
}

// Event is what the page tells the audit: a disconnection, or a refusal.
type Event struct {
	// Action is "disconnected" or "refused".
	Action   string
	Owner    string
	Upstream string
	// Reason is a refusal's short reason.
	Reason string
	// Detail says more: a refusal's words, a revocation that failed.
	Detail string
	Status int
}

// Options configures [New].
type Options struct {
	// Origin is the sign-in site's origin (its issuer): a disconnection
	// must be posted from it.
	Origin string
	// Key (32 bytes) makes the forms' tokens.
	Key []byte
	// Current is the person the request's browser is signed in as.
	Current func(*http.Request) (Person, bool)
	// SignIn sends the browser to sign in, to come back to returnTo.
	SignIn func(w http.ResponseWriter, r *http.Request, returnTo string)
	// Upstreams returns the OAuth clients of the upstreams with
	// credentials per_user, by name, of the running config.
	Upstreams func() map[string]*upstreamauth.Client
	// Audit receives each disconnection and refusal.
	Audit func(Event)
}

// Page is the connected accounts page. It is an http.Handler for Path.
type Page struct {
	opts Options
	form *htmlpage.Form
}

// New checks opts and returns the page.
func New(opts Options) (*Page, error) {
	// A form's token is a MAC of the owner, so that a form is good for
	// the person it was shown to alone.
	form, err := htmlpage.NewForm(opts.Origin, opts.Key, "connected accounts")
	if err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	if opts.Current == nil || opts.SignIn == nil || opts.Upstreams == nil {
		return nil, errors.New("accounts: Current, SignIn and Upstreams are required")
	}
	if opts.Audit == nil {
		opts.Audit = func(Event) {}
	}
	return &Page{opts: opts, form: form}, nil
}

func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		p.show(w, r)
	case http.MethodPost:
		p.disconnect(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		p.refuse(w, Event{Reason: "method", Status: http.StatusMethodNotAllowed, Detail: "Open this page with GET; its buttons POST."})
	}
}

// row is one connection on the page.
type row struct {
	Upstream string
	State    string
	Scopes   string
	Expiry   string
}

type view struct {
	Title string
	Name  string
	Lines []string
	Rows  []row
	Token string
}

var pageTemplate = template.Must(template.New("accounts").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title></head>
<body><h1 id="title">{{.Title}}</h1>
{{if .Name}}<p>Signed in as <strong id="person">{{.Name}}</strong>.</p>{{end}}
{{range .Lines}}<p class="line">{{.}}</p>
{{end}}{{if .Rows}}<table><thead><tr><th>Upstream</th><th>State</th><th>Scopes</th><th>Expires</th><th></th></tr></thead><tbody>
{{range .Rows}}<tr class="connection"><td class="upstream">{{.Upstream}}</td><td>{{.State}}</td><td>{{.Scopes}}</td><td>{{.Expiry}}</td>
<td><form method="post" action="` + Path + `"><input type="hidden" name="upstream" value="{{.Upstream}}"><input type="hidden" name="token" value="{{$.Token}}"><button type="submit">Disconnect</button></form></td></tr>
{{end}}</tbody></table>{{end}}
</body></html>
`))

// csp: nothing loads, nothing frames the page (its buttons must not be
// clickjacked), and its forms post only here.
var csp = htmlpage.MustCSP("form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'")

func write(w http.ResponseWriter, status int, v view) {
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, v); err != nil {
		http.Error(w, "the page could not be written", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	htmlpage.SetHeaders(h, csp, htmlpage.SameOrigin)
	h.Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// refuse audits e and answers it on a page.
func (p *Page) refuse(w http.ResponseWriter, e Event) {
	e.Action = "refused"
	p.opts.Audit(e)
	write(w, e.Status, view{Title: "Not done", Lines: []string{e.Detail}})
}

// show lists the signed-in person's connections, or sends them to sign in.
func (p *Page) show(w http.ResponseWriter, r *http.Request) {
	person, ok := p.opts.Current(r)
	if !ok {
		p.opts.SignIn(w, r, Path)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	ups := p.opts.Upstreams()
	names := make([]string, 0, len(ups))
	for name := range ups {
		names = append(names, name)
	}
	slices.Sort(names)
	v := view{Title: "Connected accounts", Name: person.Name, Token: p.form.Token(person.Owner)}
	if v.Name == "" {
		v.Name = person.Owner
	}
	for _, name := range names {
		conns, err := ups[name].Connections(ctx, person.Owner)
		if err != nil {
			v.Lines = append(v.Lines, "The connection to "+name+" could not be read just now; reload the page.")
			continue
		}
		for _, c := range conns {
			rw := row{Upstream: c.Upstream, State: "connected", Scopes: "-", Expiry: "-"}
			if c.State != upstreamauth.StateReady {
				rw.State = "needs connecting again"
			}
			if len(c.Scopes) > 0 {
				rw.Scopes = joinScopes(c.Scopes)
			}
			if !c.Expiry.IsZero() {
				rw.Expiry = c.Expiry.UTC().Format(time.RFC3339)
			}
			v.Rows = append(v.Rows, rw)
		}
	}
	if len(v.Rows) == 0 {
		v.Lines = append(v.Lines, "You have connected no upstream account through this gateway.")
	} else {
		v.Lines = append(v.Lines, "Disconnecting an account ends the gateway's access to it on your behalf: its tokens are revoked and deleted.")
	}
	write(w, http.StatusOK, v)
}

func joinScopes(s []string) string {
	var b bytes.Buffer
	for i, x := range s {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(x)
	}
	return b.String()
}

// disconnect ends one of the signed-in person's connections.
func (p *Page) disconnect(w http.ResponseWriter, r *http.Request) {
	f, bad := formpost.Read(w, r, p.form.Origin(), 4096)
	if bad != nil {
		p.refuse(w, Event{Reason: bad.Reason, Status: bad.Status, Detail: map[*formpost.Refusal]string{
			formpost.CrossOrigin: "A disconnection is made from this site's own page. Open the connected accounts page and press the button there.",
			formpost.Query:       "The form's fields go in its body, never in the address.",
			formpost.ContentType: "Send the form as application/x-www-form-urlencoded, as the page does.",
			formpost.Unreadable:  "The form does not read (at most 4 KiB).",
		}[bad]})
		return
	}
	if len(f) != 2 || len(f["upstream"]) != 1 || len(f["token"]) != 1 {
		p.refuse(w, Event{Reason: "form", Status: http.StatusBadRequest, Detail: "The form carries two fields, upstream and token, once each. Use the page's button."})
		return
	}
	person, ok := p.opts.Current(r)
	if !ok {
		p.refuse(w, Event{Reason: "signed_out", Status: http.StatusForbidden, Detail: "This browser is not signed in to the gateway. Open the connected accounts page, sign in, and press the button again."})
		return
	}
	upstream := f.Get("upstream")
	if !p.form.Valid(f.Get("token"), person.Owner) {
		p.refuse(w, Event{Owner: person.Owner, Upstream: upstream, Reason: "token", Status: http.StatusForbidden,
			Detail: "This form was not shown to the person signed in on this browser. Open the connected accounts page again and press the button there."})
		return
	}
	c := p.opts.Upstreams()[upstream]
	if c == nil {
		p.refuse(w, Event{Owner: person.Owner, Upstream: upstream, Reason: "upstream", Status: http.StatusNotFound,
			Detail: "No upstream of this gateway by that name takes each person's own account."})
		return
	}
	oc, err := c.ForOwner(person.Owner)
	if err != nil {
		p.refuse(w, Event{Owner: person.Owner, Upstream: upstream, Reason: "owner", Status: http.StatusBadRequest, Detail: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	found, err := oc.Revoke(ctx)
	e := Event{Action: "disconnected", Owner: person.Owner, Upstream: upstream, Status: http.StatusSeeOther}
	if err != nil {
		e.Detail = err.Error()
	}
	if found || err != nil {
		p.opts.Audit(e)
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, Path, http.StatusSeeOther)
}
