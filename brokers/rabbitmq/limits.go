package rabbitmq

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// deliveryLimit reads the effective delivery-limit of queue from the
// management API at Config.ManagementURL: the lower of the
// x-delivery-limit argument and the delivery-limit of the queue's
// effective policy (operator policies included), 0 when neither limits
// it (classic queues, which have no delivery limit; QuorumDeliveryLimit
// or -1 count as none). The API shows a new queue's policy only once the
// queue reported its statistics, seconds after Declare created it; until
// then the policy and operator policy that match the queue's name are
// read from the API's policy lists instead. setting names where it came
// from.
func (r *rabbit) deliveryLimit(ctx context.Context, queue string) (int, string, error) {
	base, err := url.Parse(r.cfg.ManagementURL)
	if err != nil || base.Host == "" {
		return 0, "", fmt.Errorf("rabbitmq: Config.ManagementURL %q: want http(s)://[user:password@]host:port", redact(r.cfg.ManagementURL))
	}
	uri, err := amqp.ParseURI(r.cfg.urls()[0])
	if err != nil {
		return 0, "", fmt.Errorf("rabbitmq: Config.URL %q: %w", redact(r.cfg.URL), err)
	}
	vhost := uri.Vhost
	if vhost == "" {
		vhost = "/"
	}
	user, pass := uri.Username, uri.Password
	if base.User != nil {
		user = base.User.Username()
		pass, _ = base.User.Password()
	}
	ctx, cancel := r.opContext(ctx)
	defer cancel()
	endpoint := strings.TrimSuffix(base.Scheme+"://"+base.Host+base.Path, "/") + "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(queue)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return 0, "", fmt.Errorf("rabbitmq: limits of %s: %w", queue, err)
	}
	req.SetBasicAuth(user, pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("rabbitmq: limits of %s: management API at %s: %w", queue, base.Host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("rabbitmq: limits of %s: management API at %s answered %s", queue, base.Host, resp.Status)
	}
	var q struct {
		Arguments       map[string]any `json:"arguments"`
		Policy          string         `json:"policy"`
		OperatorPolicy  string         `json:"operator_policy"`
		EffectivePolicy map[string]any `json:"effective_policy_definition"`
		Type            string         `json:"type"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil {
		return 0, "", fmt.Errorf("rabbitmq: limits of %s: management API answer: %w", queue, err)
	}
	if q.Type != "" && q.Type != QueueTypeQuorum {
		return 0, "", nil // only quorum queues have a delivery limit
	}
	limit, setting := 0, ""
	consider := func(v any, where string) {
		f, ok := v.(float64)
		if !ok || f <= 0 || f >= math.MaxInt32 {
			return
		}
		if n := int(f); limit == 0 || n < limit {
			limit, setting = n, where
		}
	}
	consider(q.Arguments["x-delivery-limit"], fmt.Sprintf("the x-delivery-limit argument of RabbitMQ queue %q", queue))
	pol := q.Policy
	if q.OperatorPolicy != "" {
		pol = strings.Trim(pol+", operator policy "+q.OperatorPolicy, ", ")
	}
	consider(q.EffectivePolicy["delivery-limit"], fmt.Sprintf("the delivery-limit of RabbitMQ queue %q's policy %q", queue, pol))
	if q.Policy == "" && q.OperatorPolicy == "" {
		// The management API reports a queue's policy only once the
		// queue emitted its statistics, seconds after it was declared: a
		// queue this Declare just created shows none yet, although the
		// policies matching its name apply from its creation. Find them
		// as RabbitMQ does.
		for _, kind := range []string{"policies", "operator-policies"} {
			name, def, err := matchingPolicy(ctx, base, kind, vhost, queue, user, pass)
			if err != nil {
				return 0, "", fmt.Errorf("rabbitmq: limits of %s: %w", queue, err)
			}
			if kind == "operator-policies" {
				name = "operator policy " + name
			}
			consider(def["delivery-limit"], fmt.Sprintf("the delivery-limit of RabbitMQ queue %q's policy %q", queue, name))
		}
	}
	return limit, setting, nil
}

// matchingPolicy returns the name and definition of the policy of kind
// ("policies" or "operator-policies") that RabbitMQ applies to queue in
// vhost: of those whose pattern matches the name and whose apply-to
// includes queues, the one of the highest priority
// (https://www.rabbitmq.com/docs/policies). A pattern Go's regexp cannot
// compile is skipped. It returns a nil definition when none matches.
func matchingPolicy(ctx context.Context, base *url.URL, kind, vhost, queue, user, pass string) (string, map[string]any, error) {
	endpoint := strings.TrimSuffix(base.Scheme+"://"+base.Host+base.Path, "/") + "/api/" + kind + "/" + url.PathEscape(vhost)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return "", nil, err
	}
	req.SetBasicAuth(user, pass)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", nil, fmt.Errorf("management API at %s: %w", base.Host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("management API at %s answered %s for %s", base.Host, resp.Status, kind)
	}
	var pols []struct {
		Name       string         `json:"name"`
		Pattern    string         `json:"pattern"`
		ApplyTo    string         `json:"apply-to"`
		Definition map[string]any `json:"definition"`
		Priority   int            `json:"priority"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&pols); err != nil {
		return "", nil, fmt.Errorf("management API answer for %s: %w", kind, err)
	}
	name, prio := "", 0
	var def map[string]any
	for _, p := range pols {
		switch p.ApplyTo {
		case "queues", "all", "quorum_queues", "":
		default:
			continue
		}
		re, err := regexp.Compile(p.Pattern)
		if err != nil || !re.MatchString(queue) {
			continue
		}
		if def == nil || p.Priority > prio {
			name, prio, def = p.Name, p.Priority, p.Definition
		}
	}
	return name, def, nil
}
