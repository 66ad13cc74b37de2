// Package answerlimit bounds what the gateway reads of upstream answers:
// each answer of an upstream by its max_response ([Transport]: a POST's
// answer whole, a GET stream or a subscriptions/listen per event), and the
// bytes held of every upstream's answers together by the in-flight answer
// budget ([Budget]). An answer past either fails with an error that names
// the upstream and the limit ([TooLargeError], [BudgetError]).
//
// It sits under every reader of an upstream answer (go-sdk's transports,
// the aggregated route's fast paths, the pass-through) as an
// http.RoundTripper. It never decides what a route tells its client of a
// failure, and never keeps an answer's bytes past the read that counts
// them.
package answerlimit
