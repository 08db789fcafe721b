// A direct embatch request over NATS (nats.go) with the full recovery guarantee: acknowledgement
// and resend, as docs/design/recovery.md describes them ("The full guarantee from another
// language"). A plain nc.RequestMsg is lost when nats-server drops the message or the worker
// holding it dies; this one is resent. The same program as examples/direct_nats_resend.py.
//
// Usage: go run ./resend [NATS_URL] [text ...]          (in examples/go)
// Environment: EMBATCH_SUBJECT (default "embed").
// Exit status: 0 embedded, 1 error reply or no reply within the 10 s deadline, 3 no worker
// listening (no responders for 150 ms).
//
// How: the request asks for an acknowledgement (Embatch-Ack: 1) and carries an
// Embatch-Request-Id. A worker that still holds it 20 ms after reading it sends an empty message
// with Embatch-Accepted-By on the reply subject; the reply follows on the same subject. When
// neither comes within 120 ms (doubling at each resend), nobody has the request: it is resent,
// the same id and Embatch-Attempt set to the copy's number, with the deadline that is left. After
// a resend, the id goes to <subject>.cancel once the reply is in, so a worker still holding
// another copy drops it. "No responders" (no worker in the queue group: they leave it while full
// and re-subscribe after a reconnect) is retried after 10, 20, 40 and 80 ms, as the contract
// says. (Following the acknowledging worker's heartbeat on <subject>.alive, to resend when it
// dies, is left out here.)
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	deadline  = 10 * time.Second
	firstWait = 120 * time.Millisecond // the workers' 20 ms acknowledgement delay + a margin
	// "No responders" is retried this many times, after 10, 20, 40, 80 ms.
	noRespondersRetries = 4
)

func main() { os.Exit(run()) }

func run() int {
	url := nats.DefaultURL
	if len(os.Args) > 1 {
		url = os.Args[1]
	}
	texts := []string{"Direct NATS requests skip the gateway.", "Any language with a NATS client works."}
	if len(os.Args) > 2 {
		texts = os.Args[2:]
	}
	subject := os.Getenv("EMBATCH_SUBJECT")
	if subject == "" {
		subject = "embed"
	}

	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot connect to %s: %v\n", url, err)
		return 1
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot subscribe to %s: %v\n", inbox, err)
		return 1
	}

	body, _ := json.Marshal(map[string]any{"inputs": texts, "normalize": true})
	due := time.Now().Add(deadline)
	wait, attempt, noResponders := firstWait, 1, 0
	var reply *nats.Msg
	for reply == nil && time.Now().Before(due) {
		msg := nats.NewMsg(subject)
		msg.Reply, msg.Data = inbox, body
		msg.Header.Set("Embatch-Ack", "1")
		msg.Header.Set("Embatch-Request-Id", inbox)
		msg.Header.Set("Embatch-Deadline-Ms", strconv.FormatInt(time.Until(due).Milliseconds(), 10))
		msg.Header.Set("Embatch-Version", "1")
		if attempt > 1 {
			msg.Header.Set("Embatch-Attempt", strconv.Itoa(attempt))
		}
		if err := nc.PublishMsg(msg); err != nil {
			fmt.Fprintf(os.Stderr, "publish failed: %v\n", err)
			return 1
		}
		m, err := sub.NextMsg(min(wait, time.Until(due)))
		for err == nil && m.Header.Get("Embatch-Accepted-By") != "" { // held: wait for the reply
			m, err = sub.NextMsg(max(time.Millisecond, time.Until(due)))
		}
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			if noResponders == noRespondersRetries {
				fmt.Fprintf(os.Stderr, "no embatch worker is listening on `%s` (503)\n", subject)
				return 3
			}
			time.Sleep(10 * time.Millisecond << noResponders)
			attempt, noResponders = attempt+1, noResponders+1
		case err != nil:
			attempt, wait = attempt+1, wait*2 // nobody has it: resend
		default:
			reply = m
		}
	}
	if attempt > 1 && reply != nil {
		_ = nc.Publish(subject+".cancel", []byte(inbox))
		_ = nc.Flush()
	}

	if reply == nil {
		fmt.Fprintf(os.Stderr, "no reply within %d s (504)\n", deadline/time.Second)
		return 1
	}
	if code := reply.Header.Get("Nats-Service-Error-Code"); code != "" {
		var e struct {
			Error     string `json:"error"`
			ErrorType string `json:"error_type"`
		}
		_ = json.Unmarshal(reply.Data, &e)
		fmt.Fprintf(os.Stderr, "error %s %s: %s\n", code, e.ErrorType, e.Error)
		return 1
	}
	var embeddings [][]float32
	if err := json.Unmarshal(reply.Data, &embeddings); err != nil {
		fmt.Fprintf(os.Stderr, "reply is not a JSON array of float arrays: %v\n", err)
		return 1
	}
	if len(embeddings) != len(texts) {
		fmt.Fprintf(os.Stderr, "%d vectors for %d inputs\n", len(embeddings), len(texts))
		return 1
	}
	for i, vector := range embeddings {
		head := make([]string, 0, 4)
		for _, x := range vector[:min(4, len(vector))] {
			head = append(head, fmt.Sprintf("%+.4f", x))
		}
		fmt.Printf("[nats] %d dims  [%s, ...]  %s\n", len(vector), strings.Join(head, ", "), texts[i])
	}
	return 0
}
