package connect

import (
	"bytes"
	"html/template"
	"net/http"
	"strconv"

	"github.com/Tahul/caddy-zidane-mcp/authserver/idp"
	"github.com/Tahul/caddy-zidane-mcp/internal/htmlpage"
)

// page is one of the pages this package shows a person.
type page struct {
	Title    string
	Lines    []string
	Person   *idp.Person
	Action   string // the connect form's action, on the link's page
	Upstream string
}

const style = `body{font-family:system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em;line-height:1.5}code{background:#eee;padding:0 .2em}button{font-size:1em;padding:.4em 1.2em}`

var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title><style>` + style + `</style></head>
<body><h1 id="title">{{.Title}}</h1>
{{range .Lines}}<p class="line">{{.}}</p>
{{end}}{{with .Person}}<p id="person">Signed in to the gateway as <strong id="name">{{.Name}}</strong> (owner <code id="owner">{{.Owner}}</code>).</p>
{{end}}{{if .Action}}<form method="post" action="{{.Action}}">
<p><button id="connect" name="connect" value="1" type="submit">Connect my account at {{.Upstream}}</button></p>
</form>
{{end}}</body></html>
`))

// pageCSP: nothing loads, nothing frames the pages (the connect button
// must not be clickjacked), no script runs. It has no form-action:
// browsers apply it to the redirect that follows the connect form's POST,
// which goes to the upstream's authorization server.
var pageCSP = htmlpage.MustCSP("style-src "+htmlpage.Hash(style), "frame-ancestors 'none'", "base-uri 'none'")

// writePage writes p with htmlpage's headers. The referrer goes to this
// site alone (the link is in the page's address), and does go there: the
// form posts back here (see htmlpage.SameOrigin).
func writePage(w http.ResponseWriter, status int, p page) {
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, p); err != nil {
		http.Error(w, "the page could not be written", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	htmlpage.SetHeaders(h, pageCSP, htmlpage.SameOrigin)
	h.Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func writeConnectPage(w http.ResponseWriter, action, upstream string, p idp.Person) {
	writePage(w, http.StatusOK, page{Title: "Connect your account", Person: &p, Action: action, Upstream: upstream, Lines: []string{
		"A request you made through your MCP client needs your own account at " + upstream + ".",
		"Pressing the button sends you to " + upstream + " to sign in there and approve. The gateway then keeps that account's token for " + p.Name + " alone, and uses it for " + p.Name + "'s requests only.",
		"If you are not " + p.Name + ", stop here: whoever signed this browser in as " + p.Name + " would act at " + upstream + " as you.",
	}})
}
