// Package approvalpage serves the status page of a held call (package
// approvals) on the sign-in site: what the call awaits, and, for a person
// signed in who may answer it, the buttons that approve or deny it.
//
// Anyone holding the page's address sees the held call's tool (or prompt,
// or resource) and its rule's message, and its state: the address is the
// approval's id, which names the call and is no secret. The arguments are
// shown to the signed-in caller and to people who may approve the call
// alone. Who a browser is signed in as comes from the sign-in
// (authserver/idp), never from the request; whether they may approve is
// the caller's check ([Options.May]: the approve scope for the call's
// site). An answer is a form POST that must come from the sign-in site's
// own origin (internal/formpost) and carry a token bound to the person and
// the approval; package approvals refuses the caller's own answer (unless
// the rule says self) and a second answer.
package approvalpage

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/approvals"
	"github.com/Tahul/caddy-zidane-mcp/internal/formpost"
	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
)

// PathPrefix is where the pages are served: PathPrefix and the approval's
// id.
const PathPrefix = "/zidane/approvals/"

// URL is the status page of approval id on the sign-in site issuer.
func URL(issuer, id string) string {
	return strings.TrimSuffix(issuer, "/") + PathPrefix + id
}

// Person is who a browser is signed in as.
type Person struct {
	Owner  string
	Name   string
	Scopes []string
}

// Event is a refusal of the page, for the audit (answers are audited by
// package approvals).
type Event struct {
	ID     string
	Owner  string
	Reason string
	Detail string
	Status int
}

// Options configures [New].
type Options struct {
	// Origin is the sign-in site's origin (its issuer): an answer must be
	// posted from it.
	Origin string
	// Key (32 bytes) makes the forms' tokens.
	Key   []byte
	Store *approvals.Store
	// Current is the person the request's browser is signed in as.
	Current func(*http.Request) (Person, bool)
	// May reports whether the person may answer the approval.
	May func(Person, approvals.Approval) bool
	// Audit receives each refusal.
	Audit func(Event)
}

// Page serves the status pages. It is an http.Handler for PathPrefix.
type Page struct {
	opts Options
	form *htmlpage.Form
}

// New checks opts and returns the page.
func New(opts Options) (*Page, error) {
	// A form's token binds it to the person it was shown to and the
	// approval it answers.
	form, err := htmlpage.NewForm(opts.Origin, opts.Key, "approval page")
	if err != nil {
		return nil, fmt.Errorf("approvalpage: %w", err)
	}
	if opts.Store == nil || opts.Current == nil || opts.May == nil {
		return nil, errors.New("approvalpage: Store, Current and May are required")
	}
	if opts.Audit == nil {
		opts.Audit = func(Event) {}
	}
	return &Page{opts: opts, form: form}, nil
}

// formToken is the token of the form shown to owner for approval id.
func (p *Page) formToken(owner, id string) string { return p.form.Token(owner, id) }

func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutPrefix(r.URL.Path, PathPrefix)
	if !ok || r.URL.RawQuery != "" {
		p.refuse(w, Event{ID: id, Reason: "query", Status: http.StatusBadRequest, Detail: "Open the page's address as it was given, without a query."})
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		p.show(w, r, id)
	case http.MethodPost:
		p.answer(w, r, id)
	default:
		w.Header().Set("Allow", "GET, POST")
		p.refuse(w, Event{ID: id, Reason: "method", Status: http.StatusMethodNotAllowed, Detail: "Open this page with GET; its buttons POST."})
	}
}

type view struct {
	Title     string
	Name      string
	Lines     []string
	What      string
	Message   string
	State     string
	Arguments string
	Action    string
	Token     string
}

var pageTemplate = template.Must(template.New("approval").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title></head>
<body><h1 id="title">{{.Title}}</h1>
{{if .Name}}<p>Signed in as <strong id="person">{{.Name}}</strong>.</p>{{end}}
{{if .What}}<p>Call: <strong id="call">{{.What}}</strong></p>
<p>Rule: <span id="message">{{.Message}}</span></p>
<p>State: <strong id="state">{{.State}}</strong></p>{{end}}
{{if .Arguments}}<pre id="arguments">{{.Arguments}}</pre>{{end}}
{{range .Lines}}<p class="line">{{.}}</p>
{{end}}{{if .Token}}<form method="post" action="{{.Action}}"><input type="hidden" name="token" value="{{.Token}}"><button type="submit" name="decision" value="approve" id="approve">Approve</button> <button type="submit" name="decision" value="deny" id="deny">Deny</button></form>{{end}}
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

func (p *Page) refuse(w http.ResponseWriter, e Event) {
	p.opts.Audit(e)
	write(w, e.Status, view{Title: "Not done", Lines: []string{e.Detail}})
}

// answerable reports whether person may answer a: they may approve its
// site, and they are not its caller unless the rule says self.
func (p *Page) answerable(person Person, a approvals.Approval) bool {
	return p.opts.May(person, a) && (a.Self || person.Owner != a.Owner)
}

func (p *Page) show(w http.ResponseWriter, r *http.Request, id string) {
	a, err := p.opts.Store.Get(r.Context(), id)
	if err != nil {
		status := http.StatusNotFound
		if !errors.Is(err, approvals.ErrUnknown) {
			status = http.StatusServiceUnavailable
		}
		write(w, status, view{Title: "No such held call", Lines: []string{err.Error()}})
		return
	}
	v := view{Title: "A call awaiting approval", What: what(a), Message: a.Message, State: string(a.State)}
	if a.State == approvals.Pending && !time.Now().Before(a.Expires) {
		v.State = "expired"
	}
	person, signedIn := p.opts.Current(r)
	switch {
	case !signedIn:
		v.Lines = append(v.Lines, "People who may approve calls here: sign in to the gateway, then open this page again to answer it.")
	default:
		v.Name = person.Name
		if v.Name == "" {
			v.Name = person.Owner
		}
		if person.Owner == a.Owner || p.opts.May(person, a) {
			v.Arguments = string(a.Arguments)
		}
		switch {
		case v.State != string(approvals.Pending):
		case p.answerable(person, a):
			v.Action, v.Token = PathPrefix+id, p.formToken(person.Owner, id)
			v.Lines = append(v.Lines, "Approving lets this call, with exactly these arguments, run once, until "+a.Expires.UTC().Format("15:04 UTC")+".")
		case person.Owner == a.Owner:
			v.Lines = append(v.Lines, "This is your call: someone else who may approve calls here answers it.")
		default:
			v.Lines = append(v.Lines, "You may not approve calls on this site.")
		}
	}
	write(w, http.StatusOK, v)
}

func what(a approvals.Approval) string {
	switch {
	case a.Tool != "":
		return "tool " + a.Tool
	case a.Prompt != "":
		return "prompt " + a.Prompt
	case a.URI != "":
		return "resource " + a.URI
	}
	return a.Method
}

func (p *Page) answer(w http.ResponseWriter, r *http.Request, id string) {
	f, bad := formpost.Read(w, r, p.form.Origin(), 4096)
	if bad != nil {
		p.refuse(w, Event{ID: id, Reason: bad.Reason, Status: bad.Status, Detail: map[*formpost.Refusal]string{
			formpost.CrossOrigin: "An answer is made from this site's own page. Open the held call's page and press a button there.",
			formpost.Query:       "The form's fields go in its body, never in the address.",
			formpost.ContentType: "Send the form as application/x-www-form-urlencoded, as the page does.",
			formpost.Unreadable:  "The form does not read (at most 4 KiB).",
		}[bad]})
		return
	}
	if len(f) != 2 || len(f["decision"]) != 1 || len(f["token"]) != 1 || (f.Get("decision") != "approve" && f.Get("decision") != "deny") {
		p.refuse(w, Event{ID: id, Reason: "form", Status: http.StatusBadRequest, Detail: "The form carries two fields, decision (approve or deny) and token, once each. Use the page's buttons."})
		return
	}
	person, ok := p.opts.Current(r)
	if !ok {
		p.refuse(w, Event{ID: id, Reason: "signed_out", Status: http.StatusForbidden, Detail: "This browser is not signed in to the gateway. Sign in, open the held call's page again and press a button there."})
		return
	}
	if !p.form.Valid(f.Get("token"), person.Owner, id) {
		p.refuse(w, Event{ID: id, Owner: person.Owner, Reason: "token", Status: http.StatusForbidden,
			Detail: "This form was not shown to the person signed in on this browser for this call. Open the held call's page again and press a button there."})
		return
	}
	_, err := p.opts.Store.Answer(r.Context(), id, approvals.Answerer{Owner: person.Owner, Credential: "signin:" + person.Owner},
		f.Get("decision") == "approve", func(a approvals.Approval) bool { return p.opts.May(person, a) })
	if err != nil {
		status := http.StatusForbidden
		switch {
		case errors.Is(err, approvals.ErrUnknown):
			status = http.StatusNotFound
		case errors.Is(err, approvals.ErrAnswered), errors.Is(err, approvals.ErrExpired):
			status = http.StatusConflict
		}
		// Package approvals audited the refused answer.
		write(w, status, view{Title: "Not done", Lines: []string{err.Error()}})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, PathPrefix+id, http.StatusSeeOther)
}
