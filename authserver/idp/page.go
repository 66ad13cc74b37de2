package idp

import (
	"bytes"
	"html/template"
	"net/http"
	"strconv"

	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
)

// page is one of the pages this package shows a person.
type page struct {
	Title  string
	Lines  []string
	Person *Person
}

const style = `body{font-family:system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em;line-height:1.5}code{background:#eee;padding:0 .2em}button{font-size:1em;padding:.4em 1.2em}input{font-size:1em;width:100%;box-sizing:border-box}`

var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title><style>` + style + `</style></head>
<body><h1 id="title">{{.Title}}</h1>
{{range .Lines}}<p class="line">{{.}}</p>
{{end}}{{with .Person}}<p id="person">Signed in as <strong id="name">{{.Name}}</strong> (owner <code id="owner">{{.Owner}}</code>), who may grant: <span id="scopes">{{range $i, $s := .Scopes}}{{if $i}} {{end}}<code>{{$s}}</code>{{end}}</span>.</p>
{{end}}</body></html>
`))

// linkScript puts the secret from the link's fragment (which no request
// carries) in the form, and takes it out of the address bar and history.
const linkScript = `var f=document.getElementById("secret");if(location.hash.length>1){f.value=decodeURIComponent(location.hash.slice(1));history.replaceState(null,"",location.pathname);}`

var linkPage = []byte(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in with a link</title><style>` + style + `</style></head>
<body><h1 id="title">Sign in with a link</h1>
<p>This link signs this browser in to the gateway, once. Press the button to use it.</p>
<form method="post" action="` + LinkPath + `">
<p><label for="secret">Sign-in code (filled in from the link)</label><br>
<input id="secret" name="secret" type="text" autocomplete="off" spellcheck="false" required></p>
<p><button id="signin" type="submit">Sign in</button></p>
</form>
<script>` + linkScript + `</script>
</body></html>
`)

// The pages' content security policy: nothing loads, nothing frames them,
// forms post only here; the link page runs its one script, by hash.
var (
	pageCSP     = htmlpage.MustCSP("style-src "+htmlpage.Hash(style), "form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'")
	linkPageCSP = pageCSP.With("script-src " + htmlpage.Hash(linkScript))
)

// securityHeaders are htmlpage's, with Referrer-Policy same-origin, not
// no-referrer: the link page's form posts back here (see
// htmlpage.SameOrigin).
func securityHeaders(w http.ResponseWriter, csp htmlpage.CSP) {
	htmlpage.SetHeaders(w.Header(), csp, htmlpage.SameOrigin)
}

func writePage(w http.ResponseWriter, status int, p page) {
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, p); err != nil {
		http.Error(w, "the page could not be written", http.StatusInternalServerError)
		return
	}
	securityHeaders(w, pageCSP)
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func writeLinkPage(w http.ResponseWriter) {
	securityHeaders(w, linkPageCSP)
	w.Header().Set("Content-Length", strconv.Itoa(len(linkPage)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(linkPage)
}
