package rabbitmq

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// deliveryLimit reads the effective delivery-limit of queue from the
// management API at Config.ManagementURL: the lower of the
// x-delivery-limit argument and the delivery-limit of the queue's
// effective policy (operator policies included), 0 when neither limits
// it (classic queues; QuorumDeliveryLimit or -1 count as none). setting
// names where it came from.
func (r *rabbit) deliveryLimit(ctx context.Context, queue string) (int, string, error) {
	base, err := url.Parse(r.cfg.ManagementURL)
	if err != nil || base.Host == "" {
		return 0, "", fmt.Errorf("rabbitmq: Config.ManagementURL %q: want http(s)://[user:password@]host:port", redact(r.cfg.ManagementURL))
	}
	uri, err := amqp.ParseURI(r.cfg.URL)
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
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil {
		return 0, "", fmt.Errorf("rabbitmq: limits of %s: management API answer: %w", queue, err)
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
	return limit, setting, nil
}
