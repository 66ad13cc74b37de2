package sessions

// prompt is a queued prompt or steering text.
type prompt struct {
	text  string
	owner Owner
}

// queue is a session's FIFO of prompts waiting for the running turn.
// Steering without the agent's extension goes to its head. The engine's
// lock guards it; Limits.MaxQueue bounds it.
type queue struct {
	items []prompt
}

func (q *queue) len() int { return len(q.items) }

func (q *queue) push(p prompt) { q.items = append(q.items, p) }

func (q *queue) pushFront(p prompt) {
	q.items = append(q.items, prompt{})
	copy(q.items[1:], q.items)
	q.items[0] = p
}

func (q *queue) pop() (prompt, bool) {
	if len(q.items) == 0 {
		return prompt{}, false
	}
	p := q.items[0]
	q.items[0] = prompt{}
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	return p, true
}

// clear drops every queued prompt and says how many there were.
func (q *queue) clear() int {
	n := len(q.items)
	q.items = nil
	return n
}
