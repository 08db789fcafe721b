// A direct embatch request over NATS with the official Go client (nats.go), no gateway.
//
// Usage: go run . [NATS_URL] [text ...]
// Environment: EMBATCH_SUBJECT (default "embed").
// Exit status: 0 embedded, 1 error reply or timeout, 3 no worker listening (no responders).
//
// The contract (docs/nats-contract.md): request-reply on subject "embed"; the payload is TEI's
// POST /embed JSON body; the header Embatch-Deadline-Ms carries the time budget in ms. A success
// reply is a JSON array of float arrays; an error reply carries the Nats-Service-Error-Code
// (HTTP-style status) and Nats-Service-Error headers with TEI's error JSON body.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
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

	body, _ := json.Marshal(map[string]any{"inputs": texts, "normalize": true})
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Embatch-Deadline-Ms", "10000")
	msg.Header.Set("Embatch-Version", "1")
	reply, err := nc.RequestMsg(msg, 10*time.Second)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		fmt.Fprintf(os.Stderr, "no embatch worker is listening on `%s` (503)\n", subject)
		return 3
	case errors.Is(err, nats.ErrTimeout):
		fmt.Fprintln(os.Stderr, "no reply within 10 s (504)")
		return 1
	case err != nil:
		fmt.Fprintf(os.Stderr, "request failed: %v\n", err)
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
