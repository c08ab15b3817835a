[ -f /opt/llmfleet/services/chat/current/compose.yml ] && echo "@@file chat compose.yml $(base64 -w0 < /opt/llmfleet/services/chat/current/compose.yml)"
[ -f /opt/llmfleet/services/chat/current/llmfleet-chat.service ] && echo "@@file chat llmfleet-chat.service $(base64 -w0 < /opt/llmfleet/services/chat/current/llmfleet-chat.service)"
[ -f /opt/llmfleet/services/chat/current/service.env ] && echo "@@file chat service.env $(sed '/^[[:space:]]*#/!s/^\([^=]*\)=.*/\1='"'"'********'"'"'/' /opt/llmfleet/services/chat/current/service.env | base64 -w0)"
[ -f /opt/llmfleet/services/chat/current/service.env ] && echo "@@envhash chat $(sha256sum < /opt/llmfleet/services/chat/current/service.env | cut -c1-64)"
[ -f /opt/llmfleet/services/embed/current/compose.yml ] && echo "@@file embed compose.yml $(base64 -w0 < /opt/llmfleet/services/embed/current/compose.yml)"
[ -f /opt/llmfleet/services/embed/current/llmfleet-embed.service ] && echo "@@file embed llmfleet-embed.service $(base64 -w0 < /opt/llmfleet/services/embed/current/llmfleet-embed.service)"
[ -f /opt/llmfleet/services/embed/current/service.env ] && echo "@@file embed service.env $(sed '/^[[:space:]]*#/!s/^\([^=]*\)=.*/\1='"'"'********'"'"'/' /opt/llmfleet/services/embed/current/service.env | base64 -w0)"
[ -f /opt/llmfleet/services/embed/current/service.env ] && echo "@@envhash embed $(sha256sum < /opt/llmfleet/services/embed/current/service.env | cut -c1-64)"
true
