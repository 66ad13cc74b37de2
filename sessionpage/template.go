package sessionpage

import (
	"html/template"
	"time"

	"github.com/Tahul/caddy-zidane-mcp/sessions"
)

type pageData struct {
	View    sessions.SessionView
	Turns   []sessions.Turn
	Pending []sessions.Interaction
	Now     time.Time
}

// The page refreshes itself while the session works, so it can stay open.
var pageTemplate = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{{if or (eq .View.State "running") (eq .View.State "blocked")}}<meta http-equiv="refresh" content="5">{{end}}
<title>{{.View.Title}} · session {{.View.SessionID}}</title>
<style>
body { font: 15px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #1b1b1b; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; }
.meta { color: #555; }
.state { display: inline-block; padding: .1rem .6rem; border-radius: 1rem; font-weight: 600; }
.state-idle { background: #e3f4e1; } .state-running { background: #e1ecfb; } .state-blocked { background: #fdf0d5; }
.state-error, .state-ended { background: #f8e0e0; }
section { margin-top: 1.6rem; }
.turn { border-left: 3px solid #ccd; padding: .3rem .8rem; margin: .8rem 0; }
.prompt { font-weight: 600; white-space: pre-wrap; }
.answer { white-space: pre-wrap; }
.pending { border: 1px solid #e6b34a; border-radius: .4rem; padding: .5rem .8rem; margin: .6rem 0; }
code, pre { background: #f4f4f6; padding: .1rem .3rem; border-radius: .2rem; }
pre { padding: .6rem; overflow-x: auto; }
</style>
</head>
<body>
<h1 id="title">{{.View.Title}}</h1>
<p class="meta">Session <code>{{.View.SessionID}}</code> · agent {{.View.Agent}} · in <code>{{.View.Cwd}}</code></p>
<p>State: <span id="state" class="state state-{{.View.State}}">{{.View.State}}</span>
 · {{.View.Turns}} turn{{if ne .View.Turns 1}}s{{end}}{{if .View.Queued}} · {{.View.Queued}} queued{{end}}</p>
{{if .View.Error}}<p id="error"><strong>Error:</strong> {{.View.Error}}</p>{{end}}

<section id="pending">
<h2>Waiting for an answer</h2>
{{range .Pending}}<div class="pending" data-request="{{.RequestID}}">
<strong>{{.Kind}}</strong>: {{.Summary}}
<pre>{{printf "%s" .Payload}}</pre>
<small>Answer it with the <code>interactions</code> tool: <code>answer</code>, requestId <code>{{.RequestID}}</code>.</small>
</div>{{else}}<p>Nothing is waiting.</p>{{end}}
</section>

<section id="transcript">
<h2>Transcript</h2>
{{range .Turns}}<div class="turn">
<div class="prompt">{{.Prompt}}</div>
<div class="answer">{{.Answer}}</div>
{{if .StopReason}}<small>{{.StopReason}}</small>{{end}}
</div>{{else}}<p>No turns yet.</p>{{end}}
</section>
<p class="meta"><small>Read-only view, as of {{.Now.Format "2006-01-02 15:04:05"}} UTC.</small></p>
</body>
</html>
`))
