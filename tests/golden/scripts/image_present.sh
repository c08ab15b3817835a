docker image inspect reg.lab:5000/llamacpp@sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd >/dev/null 2>&1 && echo '@@present' || echo '@@absent'
