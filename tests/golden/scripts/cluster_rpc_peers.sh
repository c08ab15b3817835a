ss -Htn state established '( sport = :50052 )' 2>/dev/null | awk '{print "@@peer " $4}'
echo '@@end'
